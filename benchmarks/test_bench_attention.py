"""Causal attention forward + backward of one RL micro-batch's layer (Qwen2.5-0.5B heads: 14 query
heads, 2 KV heads, head_dim 64, bf16), the part of the RL phase that grows with length.

Run: `pytest benchmarks/test_bench_attention.py --benchmark-only` (CUDA only).
Providers:
  varlen        the decoder's "varlen" backend: torch's flash varlen kernel over the packed rows
  sdpa_flash    scaled_dot_product_attention per sequence, the flash backend forced
  sdpa_cudnn    the same, the cuDNN backend forced (K and V expanded to the query heads when the
                backend refuses grouped heads: the expansion and its gradient sum are timed too)
  sdpa_efficient  the same, the memory-efficient backend forced
  cudnn_varlen  cuDNN's fused attention over the packed rows (aten's _cudnn_attention_forward /
                _backward with cumulative sequence starts, as torch's varlen_attn calls them when it
                picks cuDNN), K and V expanded to the query heads (cuDNN takes no grouped heads here)
Cases: 2 sequences of L tokens, L in {4096, 16384}. extra_info: "tflops", the causal FLOPs of forward
and backward, 3.5 x 4 x head_dim x heads x sum n (n + 1) / 2 (rl_shapes.py counts the same), over
the median time; "max_abs_diff", the largest |out - varlen out| and |dq - varlen dq| over the
call's outputs, on the same random inputs.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rl_shapes import DEVICE, QWEN25_05B

from oreal_fast.model.attention import make_backend

LENGTHS = {"L4096": 4096, "L16384": 16384}
SDPA = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
PROVIDERS = ("varlen", *SDPA, "cudnn_varlen")


def _inputs(length: int):
    c = QWEN25_05B
    g = torch.Generator(device=DEVICE).manual_seed(length)
    T = 2 * length
    q, k, v = (torch.randn(T, h, c.head_dim, device=DEVICE, dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (c.num_heads, c.num_kv_heads, c.num_kv_heads))
    grad = torch.randn(T, c.num_heads, c.head_dim, device=DEVICE, dtype=torch.bfloat16, generator=g)
    cu = torch.tensor([0, length, T], device=DEVICE, dtype=torch.int32)
    return q, k, v, grad, cu


def _sdpa(backend: SDPBackend, length: int):
    """Per-sequence SDPA with `backend` forced; sequence bounds known on the host (no sync)."""
    groups = QWEN25_05B.num_heads // QWEN25_05B.num_kv_heads

    def attend(q, k, v, expand):
        outs = []
        for s in (slice(0, length), slice(length, 2 * length)):
            qi, ki, vi = (x[s].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            if expand:
                ki, vi = ki.repeat_interleave(groups, 1), vi.repeat_interleave(groups, 1)
            with sdpa_kernel(backend):
                oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=not expand)
            outs.append(oi.squeeze(0).transpose(0, 1))
        return torch.cat(outs)
    return attend


class _CudnnVarlen(torch.autograd.Function):
    """Packed causal attention through aten's cuDNN varlen ops (q, k, v with equal head counts)."""

    @staticmethod
    def forward(ctx, q, k, v, cu, max_seqlen):
        res = torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, max_seqlen, max_seqlen, True, 0.0, True,
                                                      False)
        out, lse, seed, offset = res[0], res[1], res[6], res[7]
        ctx.save_for_backward(q, k, v, out, lse, cu, seed, offset)
        ctx.max_seqlen = max_seqlen
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cu, seed, offset = ctx.saved_tensors
        no_bias = torch.empty(0, device=q.device, dtype=q.dtype)  # the schema takes a tensor, not None
        # (grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k,
        #  max_q, max_k, dropout_p, is_causal), as aten's schema lists them
        dq, dk, dv = torch.ops.aten._cudnn_attention_backward(grad.contiguous(), q, k, v, out, lse, seed, offset,
                                                              no_bias, cu, cu, ctx.max_seqlen, ctx.max_seqlen, 0.0,
                                                              True)
        return dq, dk, dv, None, None


def _provider(name: str, length: int, q, k, v, cu):
    if name == "cudnn_varlen":
        groups = QWEN25_05B.num_heads // QWEN25_05B.num_kv_heads
        return lambda: _CudnnVarlen.apply(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), cu,
                                          length)
    if name == "varlen":
        backend = make_backend("varlen")
        return lambda: backend(q, k, v, cu, length)
    attend = _sdpa(SDPA[name], length)
    try:
        attend(q, k, v, expand=False)
        expand = False
    except RuntimeError:  # the backend refuses grouped heads
        expand = True
    return lambda: attend(q, k, v, expand)


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
