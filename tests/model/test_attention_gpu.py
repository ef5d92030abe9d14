"""The "cudnn" attention backend against "varlen" on a CUDA GPU: forward and backward (out, dq, dk,
dv) in bf16 on random inputs, six packed sequences of unequal lengths (one of a single token, most not
a multiple of 64), Qwen2.5-0.5B heads (14 query heads, 2 KV heads, head_dim 64).

Tolerance: per tensor, max |cudnn - varlen| <= 2^-6 x max |varlen|, i.e. 4 bf16 ulps at the tensor's
largest element. Both kernels compute in fp32 and round to bf16 (the outputs, and P and dS inside the
backward) with their own tiling and summation order, which puts elements one or two ulps apart; where
cuDNN takes K and V expanded to the query heads, dk and dv are sums of 7 bf16-rounded head gradients,
up to about two ulps more. (On an H100 with torch 2.11, out and dq at 2 x 16384 differed by 0.0039 at
most: benchmarks/test_bench_attention.py.) A wrong mask (across a sequence boundary, or not causal), a
wrong GQA head mapping or a misplaced sequence is off by a sizeable fraction of that largest element.
Each backend's distance from fp32 SDPA on the same inputs is recorded too, for the record only.
"by_length_runs" is held to the same tolerance against "varlen" on a row of short and long sequences
(its long runs in cuDNN, its short runs in varlen), and must not synchronise with the host.
"""

from __future__ import annotations

import time
from itertools import accumulate

import pytest
import torch

from oreal_fast.model.attention import CUDNN_MIN_LENGTH, make_backend, sdpa_attention, varlen_available

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and varlen_available("cuda", torch.bfloat16)),
                                reason="needs a CUDA GPU and torch's flash varlen kernel")

LENS = [1, 37, 700, 128, 2049, 515]
HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64


def _inputs(lens: list[int], seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    q, k, v, grad = (torch.randn(T, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
                     for h in (HEADS, KV_HEADS, KV_HEADS, HEADS))
    bounds = tuple(accumulate(lens, initial=0))
    return q, k, v, grad, torch.tensor(bounds, device="cuda", dtype=torch.int32), bounds


def _forward_backward(backend, q, k, v, grad, cu, bounds) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of one forward and backward of `backend` on leaf copies of q, k, v."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = backend(q, k, v, cu, max(b - a for a, b in zip(bounds, bounds[1:])), bounds)
    return [out, *torch.autograd.grad(out, (q, k, v), grad)]


def test_cudnn_matches_varlen_forward_and_backward_in_bf16(record_property):
    q, k, v, grad, cu, bounds = _inputs(LENS)
    cudnn = _forward_backward(make_backend("cudnn"), q, k, v, grad, cu, bounds)
    varlen = _forward_backward(make_backend("varlen"), q, k, v, grad, cu, bounds)
    fp32 = _forward_backward(sdpa_attention, *(x.float() for x in (q, k, v, grad)), cu, bounds)
    for name, a, b, truth in zip(("out", "dq", "dk", "dv"), cudnn, varlen, fp32):
        assert a.dtype == b.dtype == torch.bfloat16 and a.shape == b.shape, name
        diff, scale = (a.float() - b.float()).abs().max().item(), b.float().abs().max().item()
        record_property(f"{name}_max_abs_diff", diff)
        record_property(f"{name}_max_abs", scale)
        record_property(f"{name}_max_err_fp32_cudnn", (a.float() - truth).abs().max().item())
        record_property(f"{name}_max_err_fp32_varlen", (b.float() - truth).abs().max().item())
        assert diff <= 2**-6 * scale, f"{name}: max |cudnn - varlen| {diff:.3g} against max |varlen| {scale:.3g}"


# short, long, short, long, short at CUDNN_MIN_LENGTH 8192: five runs, two of them in cuDNN
MIXED_LENS = [300, 9000, 40, 8500, 700]


def test_by_length_runs_matches_varlen_forward_and_backward_in_bf16_on_a_row_of_long_and_short_sequences(
        record_property):
    assert [n >= CUDNN_MIN_LENGTH for n in MIXED_LENS] == [False, True, False, True, False]
    q, k, v, grad, cu, bounds = _inputs(MIXED_LENS)
    runs = _forward_backward(make_backend("by_length_runs"), q, k, v, grad, cu, bounds)
    varlen = _forward_backward(make_backend("varlen"), q, k, v, grad, cu, bounds)
    for name, a, b in zip(("out", "dq", "dk", "dv"), runs, varlen):
        assert a.dtype == b.dtype == torch.bfloat16 and a.shape == b.shape, name
        diff, scale = (a.float() - b.float()).abs().max().item(), b.float().abs().max().item()
        record_property(f"{name}_max_abs_diff", diff)
        record_property(f"{name}_max_abs", scale)
        assert diff <= 2**-6 * scale, (f"{name}: max |by_length_runs - varlen| {diff:.3g} against max |varlen| "
                                       f"{scale:.3g}")


def test_by_length_runs_forward_and_backward_do_not_synchronise():
    """Under CUDA's sync debug mode "error" any host sync raises (cu_seqlens read on the host, say; the
    RL phase's own no-sync test, tests/trainer/test_rl_phase_gpu.py, holds varlen and cudnn to this
    too). The first call, before it, makes the cudnn backend's grouped-heads decision and builds
    cuDNN's graphs for these lengths."""
    inputs = _inputs(MIXED_LENS)
    backend = make_backend("by_length_runs")
    _forward_backward(backend, *inputs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _forward_backward(backend, *inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_cudnn_time_at_new_lengths_against_known_ones(record_property):
    """cuDNN builds (on the host) one graph per shape, forward and backward, at its first call; an RL
    phase meets new lengths all the time, which the backend pads to a multiple of CUDNN_LENGTH_BUCKET.
    Recorded, not asserted: the milliseconds of one forward + backward of 2 sequences in buckets never
    seen, of 2 new lengths in those buckets (in a row of another total length), and of the latter again."""
    backend = make_backend("cudnn")
    _forward_backward(backend, *_inputs([3001, 2999], seed=1))  # the grouped-heads decision and warm-up
    times = {}
    for label, lens in (("new_buckets_ms", [4093, 4099]), ("new_lengths_known_buckets_ms", [4090, 4105]),
                        ("known_lengths_ms", [4090, 4105])):
        inputs = _inputs(lens, seed=2)
        torch.cuda.synchronize()
        start = time.perf_counter()
        _forward_backward(backend, *inputs)
        torch.cuda.synchronize()
        times[label] = 1e3 * (time.perf_counter() - start)
        record_property(label, times[label])
    assert all(ms > 0 for ms in times.values())
