"""The attention backends' names and the "cudnn" backend's rules on CPU: what `resolve_backend_name`
refuses, the host bounds the backend needs, and its grouped-heads decision (the kernels themselves
run in test_attention_gpu.py)."""

from __future__ import annotations

from itertools import accumulate

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from oreal_fast.model import attention
from oreal_fast.model.attention import make_backend, resolve_backend_name, sdpa_attention

LENS = [5, 11, 1, 7]
BOUNDS = tuple(accumulate(LENS, initial=0))


_REAL_SDPA = F.scaled_dot_product_attention


def _math_sdpa(q, k, v, *, is_causal, enable_gqa):
    """What the cuDNN stand-ins below compute: SDPA's math kernel (the CPU has no cuDNN)."""
    with sdpa_kernel(SDPBackend.MATH):
        return _REAL_SDPA(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)


def _qkv(heads: int = 4, kv_heads: int = 2, dim: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    T = sum(LENS)
    return tuple(torch.randn(T, h, dim, generator=g) for h in (heads, kv_heads, kv_heads))


@pytest.mark.parametrize("device, dtype, why", [
    ("cpu", torch.bfloat16, "device cpu"),
    (None, torch.float16, "device cpu"),
    ("cuda", torch.float32, "compute dtype torch.float32"),
])
def test_cudnn_is_refused_without_cuda_and_bf16_or_fp16(device, dtype, why):
    with pytest.raises(ValueError, match=f"'cudnn' needs a CUDA device and bf16/fp16 compute, got .*{why}"):
        resolve_backend_name("cudnn", device, dtype)


@pytest.mark.parametrize("device", ["cuda", "meta"])
def test_cudnn_resolves_for_cuda_and_for_a_model_built_on_meta(device):
    """No GPU needed to resolve the name; meta is a model that its loader fills on the real device."""
    assert resolve_backend_name("cudnn", device, torch.bfloat16) == "cudnn"


def test_auto_picks_by_length_for_half_compute_on_cuda_and_sdpa_elsewhere():
    assert resolve_backend_name("auto", "cpu", torch.float32) == "sdpa"
    assert resolve_backend_name("auto", "cuda", torch.float32) == "sdpa"
    if attention._varlen_fn() is not None:
        assert resolve_backend_name("auto", "cuda", torch.bfloat16) == "by_length"


def test_by_length_sends_rows_of_long_sequences_only_to_cudnn_and_the_others_to_varlen(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "_make_varlen_backend", lambda: lambda *args: calls.append("varlen"))
    monkeypatch.setattr(attention, "_make_cudnn_backend", lambda: lambda *args: calls.append("cudnn"))
    backend = make_backend("by_length")
    q, k, v = _qkv()
    cu = torch.tensor(BOUNDS, dtype=torch.int32)  # LENS = [5, 11, 1, 7]
    monkeypatch.setattr(attention, "CUDNN_MIN_LENGTH", 5)
    long_only = (0, 5, 16, 24)  # 5, 11, 8 tokens: every sequence long
    backend(q, k, v, torch.tensor(long_only, dtype=torch.int32), 11, long_only)
    backend(q, k, v, cu, 11, BOUNDS)  # a sequence of 1 token beside the long ones
    backend(q, k, v, torch.tensor(long_only, dtype=torch.int32), 11)  # no host bounds: cudnn would sync
    monkeypatch.setattr(attention, "CUDNN_MIN_LENGTH", 12)
    backend(q, k, v, torch.tensor(long_only, dtype=torch.int32), 11, long_only)  # none long enough
    assert calls == ["cudnn", "varlen", "varlen", "varlen"]


def test_cudnn_refuses_a_call_without_host_bounds():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="'cudnn' needs cu_seqlens_host"):
        make_backend("cudnn")(q, k, v, torch.tensor(BOUNDS, dtype=torch.int32), max(LENS))


def test_sdpa_reads_the_host_bounds_when_given():
    q, k, v = _qkv()
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    assert torch.equal(sdpa_attention(q, k, v, cu, max(LENS), BOUNDS), sdpa_attention(q, k, v, cu, max(LENS)))


@pytest.mark.parametrize("native_gqa", [True, False], ids=["cudnn_takes_gqa", "cudnn_refuses_gqa"])
def test_cudnn_tries_native_grouped_heads_once_then_keeps_the_answer(monkeypatch, native_gqa):
    """SDPA stands in for cuDNN here (the CPU has none): it checks that only the cuDNN backend is
    enabled, raises on a key length of 1 as cuDNN does, and, for a torch whose cuDNN path refuses
    grouped heads, raises on enable_gqa as torch does. Two calls: the first asks for native grouped
    heads once; the second follows its answer. The lone token (LENS holds a 1) never reaches cuDNN."""
    calls = []

    def cudnn_stand_in(q, k, v, *, is_causal, enable_gqa):
        assert torch.backends.cuda.cudnn_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
        assert not torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.mem_efficient_sdp_enabled()
        if k.shape[2] == 1:
            raise RuntimeError("No available kernel. Aborting execution.")
        calls.append((enable_gqa, k.shape[1]))
        if enable_gqa and not native_gqa:
            raise RuntimeError("No available kernel. Aborting execution.")
        return _math_sdpa(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", cudnn_stand_in)
    q, k, v = _qkv()
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    backend = make_backend("cudnn")
    outs = [backend(q, k, v, cu, max(LENS), BOUNDS) for _ in range(2)]
    monkeypatch.undo()
    expected = sdpa_attention(q, k, v, cu, max(LENS), BOUNDS)
    assert all(torch.allclose(out, expected, atol=1e-6) for out in outs)
    per_call = sum(n > 1 for n in LENS)
    if native_gqa:  # the KV heads as they are, in every call
        assert calls == [(True, 2)] * 2 * per_call
    else:  # one refused try, then K and V expanded to the 4 query heads, in this call and the next
        assert calls == [(True, 2)] + [(False, 4)] * 2 * per_call


def test_cudnn_forward_and_backward_equal_sdpa_with_a_lone_token(monkeypatch):
    """The lone token's output is its value, returned without cuDNN: forward and gradients of the
    whole packed row (LENS holds a sequence of one token) equal the sdpa backend's."""

    def cudnn_stand_in(q, k, v, *, is_causal, enable_gqa):
        assert k.shape[2] > 1, "cuDNN refuses a key length of 1"
        return _math_sdpa(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)

    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    results = []
    for name in ("cudnn", "sdpa"):
        q, k, v = (x.double().requires_grad_() for x in _qkv())
        with monkeypatch.context() as patch:
            if name == "cudnn":
                patch.setattr(F, "scaled_dot_product_attention", cudnn_stand_in)
            out = make_backend(name)(q, k, v, cu, max(LENS), BOUNDS)
        grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
        out.backward(grad)
        results.append((out, q.grad, k.grad, v.grad))
    lone = BOUNDS[LENS.index(1)]
    # the sdpa reference: no gradient into a lone query, up to float64 round-off (torch 2.13's CPU
    # math kernel leaves ~1e-16 there: softmax's backward of one key is p (dp - p dp), not a zero)
    assert results[1][1][lone].abs().max() <= 1e-12
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_cudnn_out_of_memory_in_the_grouped_heads_try_is_raised_not_taken_for_a_refusal(monkeypatch):
    """Running out of memory says nothing about grouped heads: it reaches the caller (the trainer's
    out-of-memory handling), and the next call tries cuDNN's grouped heads again."""
    calls = []

    def cudnn_stand_in(q, k, v, *, is_causal, enable_gqa):
        calls.append(enable_gqa)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return _math_sdpa(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", cudnn_stand_in)
    q, k, v = _qkv()
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    backend = make_backend("cudnn")
    with pytest.raises(torch.OutOfMemoryError):
        backend(q, k, v, cu, max(LENS), BOUNDS)
    backend(q, k, v, cu, max(LENS), BOUNDS)
    assert calls[0] is True and calls[1] is True  # the retry asked for native grouped heads again
