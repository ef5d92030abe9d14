"""The attention backends' names and the "cudnn" backend's rules on CPU: what `resolve_backend_name`
refuses, the host bounds the backend needs, and its grouped-heads decision; how "by_length" and
"by_length_runs" route a row between stand-ins for "cudnn" and "varlen", and that the runs' outputs
and gradients, packed again, are the whole row's (the kernels themselves run in test_attention_gpu.py)."""

from __future__ import annotations

import random
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


@pytest.mark.parametrize("device, dtype, varlen", [
    ("cuda", torch.bfloat16, True), ("meta", torch.float16, True), ("cpu", torch.bfloat16, True),
    ("cuda", torch.float32, True), ("cuda", torch.bfloat16, False),
])
def test_by_length_runs_resolves_where_by_length_does_and_is_refused_where_it_is(monkeypatch, device, dtype, varlen):
    """The two need the same: a CUDA device (or meta), bf16/fp16 compute and torch's varlen kernel."""
    if not varlen:
        monkeypatch.setattr(attention, "_varlen_fn", lambda: None)
    answers = []
    for name in ("by_length", "by_length_runs"):
        try:
            answers.append(resolve_backend_name(name, device, dtype))
        except ValueError as e:
            answers.append(str(e).replace(repr(name), "NAME"))
    assert answers[1] == ("by_length_runs" if answers[0] == "by_length" else answers[0])
    assert (answers[0] == "by_length") == (device in ("cuda", "meta") and dtype != torch.float32 and varlen)


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


class _DeviceBounds(torch.Tensor):
    """A `cu_seqlens` whose values nothing may read on the host (on a GPU that is a sync); tensor ops on
    it give `_DeviceBounds` again, so a fake backend can tell bounds derived from it on the device from
    bounds rebuilt from host ints (a plain tensor)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__int__,
                    torch.Tensor.__index__, torch.Tensor.__bool__, torch.Tensor.__float__):
            raise AssertionError(f"cu_seqlens read on the host ({func.__name__})")
        return super().__torch_function__(func, types, args, kwargs or {})


def _device_bounds(bounds) -> torch.Tensor:
    return torch.tensor(bounds, dtype=torch.int32).as_subclass(_DeviceBounds)


def _fake_backends(monkeypatch, calls: list, attend=None) -> None:
    """Fake "varlen" and "cudnn" backends: each appends (its name, the arguments it got) to `calls`,
    checks that its device bounds came from `cu_seqlens` on the device, start at 0, end at its token
    count and equal its host bounds, and returns `attend(name, q, k, v, cu_seqlens as a plain tensor,
    max_seqlen, cu_seqlens_host)`, or q itself without `attend`."""

    def fake(name):
        def backend(*args):
            q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host = args
            assert isinstance(cu_seqlens, _DeviceBounds), f"{name}: bounds rebuilt on the host"
            cu = cu_seqlens.as_subclass(torch.Tensor)
            assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == q.shape[0], name
            assert cu_seqlens_host is None or cu.tolist() == list(cu_seqlens_host), name
            calls.append((name, args))
            return q if attend is None else attend(name, q, k, v, cu, max_seqlen, cu_seqlens_host)
        return lambda: backend

    monkeypatch.setattr(attention, "_make_varlen_backend", fake("varlen"))
    monkeypatch.setattr(attention, "_make_cudnn_backend", fake("cudnn"))


def _token_rows(bounds, heads: int = 4, kv_heads: int = 2, dim: int = 3) -> tuple[torch.Tensor, ...]:
    """q [T, heads, dim], k and v [T, kv_heads, dim] holding each token's row index in every element."""
    rows = torch.arange(bounds[-1], dtype=torch.float64)[:, None, None]
    return tuple(rows.expand(-1, h, dim).contiguous() for h in (heads, kv_heads, kv_heads))


def test_by_length_runs_sends_each_run_of_long_or_short_sequences_to_one_call_over_its_slice(monkeypatch):
    monkeypatch.setattr(attention, "CUDNN_MIN_LENGTH", 8)
    calls = []
    _fake_backends(monkeypatch, calls)
    lens = [3, 9, 8, 2, 5, 10]  # short, long, long, short, short, long
    bounds = tuple(accumulate(lens, initial=0))  # (0, 3, 12, 20, 22, 27, 37)
    q, k, v = _token_rows(bounds)
    out = make_backend("by_length_runs")(q, k, v, _device_bounds(bounds), max(lens), bounds)
    seen = []
    for name, (q_run, k_run, v_run, cu, max_seqlen, host) in calls:
        rows = q_run[:, 0, 0].long().tolist()
        assert all(torch.equal(x, y[rows]) for x, y in ((q_run, q), (k_run, k), (v_run, v))), name
        seen.append((name, rows[0], len(rows), cu.as_subclass(torch.Tensor).tolist(), max_seqlen, host))
    # (backend, first token, tokens, device bounds shifted to 0, the run's longest sequence, host bounds)
    assert seen == [("varlen", 0, 3, [0, 3], 3, (0, 3)),
                    ("cudnn", 3, 17, [0, 9, 17], 9, (0, 9, 17)),
                    ("varlen", 20, 7, [0, 2, 7], 5, (0, 2, 7)),
                    ("cudnn", 27, 10, [0, 10], 10, (0, 10))]
    assert torch.equal(out, q)  # the runs' outputs packed back in row order


@pytest.mark.parametrize("lens, host", [
    ([3, 5, 1, 7], True),
    ([8, 12, 9], True),
    ([3, 9, 8, 2], False),  # runs of both kinds, but no host bounds to cut them by
    ([20], True),
    ([4], True),
], ids=["all_short", "all_long", "no_host_bounds", "one_long", "one_short"])
def test_by_length_runs_makes_the_call_by_length_makes_for_a_row_of_one_run_or_without_host_bounds(monkeypatch,
                                                                                                   lens, host):
    monkeypatch.setattr(attention, "CUDNN_MIN_LENGTH", 8)
    bounds = tuple(accumulate(lens, initial=0))
    q, k, v = _token_rows(bounds)
    args = (q, k, v, _device_bounds(bounds), max(lens), bounds if host else None)
    made = {}
    for name in ("by_length", "by_length_runs"):
        made[name] = []
        _fake_backends(monkeypatch, made[name])
        assert make_backend(name)(*args) is q, name
    (backend, got), = made["by_length_runs"]
    ((want_backend, want),) = made["by_length"]
    assert backend == want_backend == ("cudnn" if host and min(lens) >= 8 else "varlen")
    assert all(a is b for a, b in zip(got, want, strict=True))  # the very tensors, bounds and ints


def _random_lens(seed: int) -> list[int]:
    """1 to 7 sequences, each short (1 to 7 tokens) or long (8 to 20) at random."""
    rng = random.Random(seed)
    return [rng.randint(8, 20) if rng.random() < 0.5 else rng.randint(1, 7) for _ in range(rng.randint(1, 7))]


@pytest.mark.parametrize("lens, heads", [
    ([3, 9, 8, 2, 5, 10], (4, 2)),
    ([1, 12, 1, 1, 9, 3], (4, 4)),  # lone tokens in the short runs, heads not grouped
    ([2, 5, 7, 1], (4, 2)),
    ([8, 15, 9], (2, 1)),
    ([13], (4, 2)),
    *((_random_lens(seed), (4, 2)) for seed in range(6)),
], ids=["mixed", "lone_tokens_mha", "only_short", "only_long", "single", *(f"random{s}" for s in range(6))])
def test_by_length_runs_forward_and_backward_equal_sdpa_on_the_whole_row(monkeypatch, lens, heads):
    """The fakes attend exactly (the sdpa backend, float64): "varlen" reads only the device bounds it
    gets, "cudnn" only the host ones, so a run given a wrong slice, wrongly shifted bounds of either
    kind, or left out or misplaced, changes the output or a gradient."""
    monkeypatch.setattr(attention, "CUDNN_MIN_LENGTH", 8)
    calls = []
    _fake_backends(monkeypatch, calls, attend=lambda name, q, k, v, cu, max_seqlen, host: sdpa_attention(
        q, k, v, cu, max_seqlen, host if name == "cudnn" else None))
    bounds = tuple(accumulate(lens, initial=0))
    g = torch.Generator().manual_seed(len(lens))
    (Hq, Hkv), T = heads, bounds[-1]
    leaves = [torch.randn(T, h, 8, generator=g, dtype=torch.float64) for h in (Hq, Hkv, Hkv)]
    grad = torch.randn(T, Hq, 8, generator=g, dtype=torch.float64)
    results = []
    for name in ("by_length_runs", "sdpa"):
        q, k, v = (x.clone().requires_grad_() for x in leaves)
        cu = _device_bounds(bounds) if name == "by_length_runs" else torch.tensor(bounds, dtype=torch.int32)
        out = make_backend(name)(q, k, v, cu, max(lens), bounds)
        results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    assert len(calls) == 1 + sum((a >= 8) != (b >= 8) for a, b in zip(lens, lens[1:]))  # one call a run
    for got, want, name in zip(*results, ("out", "dq", "dk", "dv")):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)


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
