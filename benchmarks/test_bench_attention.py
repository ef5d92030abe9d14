"""Causal attention forward + backward of one RL micro-batch's layer (Qwen2.5-0.5B heads: 14 query
heads, 2 KV heads, head_dim 64, bf16), the part of the RL phase that grows with length.

Run: `pytest benchmarks/test_bench_attention.py --benchmark-only` (CUDA only).
Providers:
  varlen        the decoder's "varlen" backend: torch's flash varlen kernel over the packed rows
  cudnn         the decoder's "cudnn" backend: scaled_dot_product_attention per sequence with the
                cuDNN kernel forced, on the row's host bounds (K and V expanded to the query heads
                where cuDNN refuses grouped heads: the expansion and its gradient sum are timed too)
  sdpa_flash    the decoder's "sdpa" backend (per sequence, grouped heads native) with SDPA's flash
                kernel forced
  sdpa_efficient  the same with the memory-efficient kernel forced
Cases: 2 sequences of L tokens, L in {1024, 2048, 4096, 8192, 16384}. extra_info: "tflops", the causal FLOPs of forward
and backward, 3.5 x 4 x head_dim x heads x sum n (n + 1) / 2 (rl_shapes.py counts the same), over
the median time; "max_abs_diff", the largest |out - varlen out| and |dq - varlen dq| over the
call's outputs, on the same random inputs.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from rl_shapes import DEVICE, QWEN25_05B

from oreal_fast.model.attention import make_backend, sdpa_attention

LENGTHS = {"L1024": 1024, "L2048": 2048, "L4096": 4096, "L8192": 8192, "L16384": 16384}
SDPA_PEERS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
PROVIDERS = ("varlen", "cudnn", *SDPA_PEERS)


def _inputs(length: int):
    c = QWEN25_05B
    g = torch.Generator(device=DEVICE).manual_seed(length)
    T = 2 * length
    q, k, v = (torch.randn(T, h, c.head_dim, device=DEVICE, dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (c.num_heads, c.num_kv_heads, c.num_kv_heads))
    grad = torch.randn(T, c.num_heads, c.head_dim, device=DEVICE, dtype=torch.bfloat16, generator=g)
    cu = torch.tensor([0, length, T], device=DEVICE, dtype=torch.int32)
    return q, k, v, grad, cu


def _provider(name: str, length: int, q, k, v, cu):
    bounds = (0, length, 2 * length)
    if name in ("varlen", "cudnn"):
        backend = make_backend(name)
        return lambda: backend(q, k, v, cu, length, bounds)

    def forced():
        with sdpa_kernel(SDPA_PEERS[name]):
            return sdpa_attention(q, k, v, cu, length, bounds)
    return forced


@pytest.mark.parametrize("length_id", list(LENGTHS))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_attention_fwd_bwd(benchmark, provider, length_id):
    length = LENGTHS[length_id]
    gc.collect()
    torch.cuda.empty_cache()
    q, k, v, grad, cu = _inputs(length)
    try:
        forward = _provider(provider, length, q, k, v, cu)
        out = forward()
        (dq,) = torch.autograd.grad(out, (q,), grad)
    except (RuntimeError, AttributeError, TypeError) as e:
        pytest.skip(f"{provider} cannot run this case here: {str(e)[:200]}")
    ref_out = make_backend("varlen")(q, k, v, cu, length)
    (ref_dq,) = torch.autograd.grad(ref_out, (q,), grad)
    diff = max((out - ref_out).abs().max().item(), (dq - ref_dq).abs().max().item())

    def step():
        o = forward()
        torch.autograd.grad(o, (q, k, v), grad)
        torch.cuda.synchronize()

    step()
    benchmark.pedantic(step, rounds=5, iterations=1, warmup_rounds=1)
    c = QWEN25_05B
    flops = 3.5 * 4 * c.head_dim * c.num_heads * 2 * (length * (length + 1) // 2)
    benchmark.extra_info.update(tflops=flops / benchmark.stats.stats.median / 1e12, max_abs_diff=diff,
                                length=length, sequences=2)
