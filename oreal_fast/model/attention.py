"""Causal attention over packed varlen rows.

A backend is a function `(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], cu_seqlens [N+1] int32,
max_seqlen, cu_seqlens_host=None) -> out [T, Hq, D]` computing causal softmax attention inside each
packed sequence. `cu_seqlens_host` is `cu_seqlens` as host ints, passed by a caller that has them (a
`PackedRow` carries them from packing): a backend that splits the row per sequence reads them instead
of copying `cu_seqlens` to the host, which would wait for the GPU in every layer.
The decoder picks one backend at construction (`resolve_backend_name`, `make_backend`); every backend gives the same
result up to rounding, which the tests check against each other.

- "sdpa": `scaled_dot_product_attention` once per sequence. Correct on every device and dtype;
  without `cu_seqlens_host` it reads `cu_seqlens` on the host, a sync per layer (fine for CPU and tests).
- "varlen": torch's flash varlen kernel (`torch.nn.attention.varlen.varlen_attn`), CUDA with
  bf16/fp16 only. Its keyword set moved between torch releases (`is_causal` vs `window_size`,
  `enable_gqa`), so the call is adapted once from its signature. Ignores `cu_seqlens_host`.
- "cudnn": `scaled_dot_product_attention` once per sequence with the cuDNN backend forced, CUDA with
  bf16/fp16 only. It needs `cu_seqlens_host` and refuses a call without it, so it never syncs.
  Grouped heads: cuDNN's own (`enable_gqa=True`) where it takes them, else K and V expanded to the
  query heads (`repeat_interleave`, whose backward sums each group's gradients), decided by the first
  grouped call (the native call raising means expand) and kept for the backend's life. cuDNN
  refuses a sequence of one token; its output is its value, which the backend returns itself.
  On an H100 (torch 2.11, one layer's forward + backward over 2 sequences, as below) it took 8.3 ms
  to varlen's 12.3 ms at 2 x 16384 and 1.17 to 1.60 ms at 2 x 4096, but more than varlen at 2 x 2048
  and below (benchmarks/test_bench_attention.py). It costs
  one SDPA call per sequence and layer. cuDNN builds a graph per shape on the host (on an H100 about
  0.3 s for the forward and backward of two new lengths, against 2 ms once built), so each sequence
  is padded with zero rows to a multiple of `CUDNN_LENGTH_BUCKET` tokens: a run builds at most two
  graph pairs per bucket (padded, and a length already on a bucket), and the padding adds under 256
  rows of causal work a sequence. The strides cuDNN sees depend on the bucket and the heads alone,
  never on the packed row's length.
  For the backward it keeps, as "sdpa" does, one [T, Hq, D] tensor a layer more than "varlen" (the
  per-sequence outputs and their packed copy), and K and V at the query heads where it expands them.
- "by_length", what "auto" picks on CUDA with bf16/fp16: "cudnn" for a row whose sequences all have
  at least `CUDNN_MIN_LENGTH` tokens (and whose host bounds are given), "varlen" otherwise: a row
  that also holds short sequences would run each of them as a cuDNN call of its own, padded to
  `CUDNN_LENGTH_BUCKET`, in every layer, and that has not been measured against varlen.
- "by_length_runs": the row cut (on its host bounds) into maximal runs of consecutive sequences that
  all have at least `CUDNN_MIN_LENGTH` tokens or all have fewer; each long run goes to "cudnn" and
  each short run to one "varlen" call, over the run's slice of the row with its bounds shifted to
  start at 0 (the device bounds shifted on the device: no sync), and the outputs are packed again.
  A row of one run makes the very call "by_length" makes, and so does a call without
  `cu_seqlens_host` (varlen on the whole row). It is meant for the RL phase's mixed rows, where one
  sequence of 10-12k tokens beside dozens of short ones holds ~90 % of the row's attention FLOPs and
  "by_length" runs it in varlen, 1.4-1.5x slower than cuDNN at those lengths (above). A row of
  several runs keeps, as "cudnn" does, one [T, Hq, D] tensor a layer more than "varlen" (the runs'
  outputs and their packed copy). Not yet measured against "by_length" on a GPU, so "auto" keeps
  "by_length".

This module does not do KV caches: generation passes its own cache object to `Decoder.forward`
(`oreal_fast.rollout`).
Invariant: attention never crosses a `cu_seqlens` boundary; `cu_seqlens_host`, when given, equals
`cu_seqlens.tolist()` (nothing checks it: checking would be the sync it avoids).
"""

from __future__ import annotations

import inspect
from typing import Callable, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class AttentionBackend(Protocol):
    """What `make_backend` returns (the module docstring)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                 cu_seqlens_host: tuple[int, ...] | None = None) -> torch.Tensor: ...


BACKEND_NAMES = ("auto", "sdpa", "varlen", "cudnn", "by_length", "by_length_runs")
# the compute dtypes the CUDA kernels ("varlen", "cudnn") take
HALF_DTYPES = (torch.bfloat16, torch.float16)
# "cudnn" pads each sequence to a multiple of this many tokens: cuDNN builds a graph per shape, so a
# run meets at most max_len / 256 of them (~0.15 s each, forward and backward, on an H100)
CUDNN_LENGTH_BUCKET = 256
# "by_length" (what "auto" picks on CUDA) sends a row whose sequences all have at least this many
# tokens to "cudnn", any other row to "varlen"; "by_length_runs" sends each run of such sequences to
# "cudnn", each run of shorter ones to "varlen". On an H100, one layer's forward + backward of 2
# sequences: cudnn 1.38x varlen at 8192 and 1.48x at 16384, 1.37x at 4096 where the whole RL
# micro-batch benchmark could not tell them apart in three runs, slower at 2048 and below
# (benchmarks/RESULTS.md)
CUDNN_MIN_LENGTH = 8192


def _per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: tuple[int, ...] | list[int],
                  attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`attend` on each sequence [start, end) of the host `bounds` (q [n, Hq, D], k and v [n, Hkv, D]
    slices of the packed row -> [n, Hq, D]); the outputs packed again: [T, Hq, D]."""
    return torch.cat([attend(q[start:end], k[start:end], v[start:end]) for start, end in zip(bounds[:-1], bounds[1:])],
                     dim=0)


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> torch.Tensor:
    """Causal SDPA of one sequence in the packed layout: q [n, Hq, D], k and v [n, Hkv, D] -> [n, Hq, D]
    (as (1, heads, n, D) views, whichever kernel the caller's `sdpa_kernel` context allows)."""
    out = F.scaled_dot_product_attention(*(x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)), is_causal=True,
                                         enable_gqa=enable_gqa)
    return out.squeeze(0).transpose(0, 1)


def _expand_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [T, Hkv, D] repeated to the query heads: [T, Hq, D] each (query head h reads KV head h // group)."""
    group = q.shape[1] // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
    cu_seqlens_host: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Causal attention per packed sequence with SDPA (any device, any dtype).

    Args:
        q: [T, Hq, D]; k, v: [T, Hkv, D] with Hq a multiple of Hkv.
        cu_seqlens: [N+1] int32, cumulative sequence starts (0 first, T last).
        max_seqlen: unused here; part of the backend signature.
        cu_seqlens_host: `cu_seqlens` as host ints, or None to read them from `cu_seqlens` (a sync).

    Returns:
        out: [T, Hq, D], same dtype as q.
    """
    bounds = cu_seqlens.tolist() if cu_seqlens_host is None else cu_seqlens_host
    return _per_sequence(q, k, v, bounds, lambda qi, ki, vi: _causal_sdpa(qi, ki, vi, enable_gqa=True))


def _make_cudnn_backend() -> AttentionBackend:
    native_gqa: bool | None = None  # None until the first call with grouped heads tries cuDNN's own

    def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> torch.Tensor:
        """One sequence: q [n, Hq, D], k and v [n, Hkv, D] -> [n, Hq, D]."""
        n = q.shape[0]
        if n == 1:
            # cuDNN refuses a key length of 1; a lone token attends to itself only: its output is its
            # value, exactly (softmax of one score is 1), and the gradient flows to v alone.
            return v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        pad = -n % CUDNN_LENGTH_BUCKET
        if pad:
            # zero rows after the sequence, up to the bucket: causal queries never see them, so the
            # first n outputs are the sequence's own. Padded in the packed [n, H, D] layout, the one
            # cuDNN is fast in (a (1, H, n, D) contiguous copy runs a slower kernel).
            q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        return _causal_sdpa(q, k, v, enable_gqa)[:n]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: tuple[int, ...],
               enable_gqa: bool) -> torch.Tensor:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return _per_sequence(q, k, v, bounds, lambda qi, ki, vi: attend_one(qi, ki, vi, enable_gqa))

    def cudnn_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        cu_seqlens_host: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        nonlocal native_gqa
        if cu_seqlens_host is None:
            raise ValueError("attention backend 'cudnn' needs cu_seqlens_host (the host bounds a PackedRow "
                             "carries, passed to Decoder.forward): reading cu_seqlens would sync in every layer")
        if k.shape[1] == q.shape[1]:
            return attend(q, k, v, cu_seqlens_host, enable_gqa=False)
        if native_gqa is None:
            try:
                out = attend(q, k, v, cu_seqlens_host, enable_gqa=True)
            except torch.OutOfMemoryError:  # memory, not the kernel's answer: the caller's to handle
                raise
            except RuntimeError:  # this torch's cuDNN path refuses grouped heads: expand them from now on
                native_gqa = False
            else:
                native_gqa = True
                return out
        if native_gqa:
            return attend(q, k, v, cu_seqlens_host, enable_gqa=True)
        return attend(q, *_expand_kv(q, k, v), cu_seqlens_host, enable_gqa=False)

    return cudnn_attention


def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _make_varlen_backend() -> AttentionBackend:
    varlen_attn = _varlen_fn()
    params = inspect.signature(varlen_attn).parameters
    # torch 2.10 spelled causality `is_causal`; 2.11+ spells it as a (left, right) window.
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    native_gqa = "enable_gqa" in params
    if native_gqa:
        causal["enable_gqa"] = True

    def varlen_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        cu_seqlens_host: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        if not native_gqa and k.shape[1] != q.shape[1]:
            k, v = _expand_kv(q, k, v)  # (T, Hq, D)
        return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **causal)

    return varlen_attention


def varlen_available(device: torch.device | str | None, dtype: torch.dtype | None) -> bool:
    """True when the flash varlen kernel can run for this device and dtype."""
    device = torch.device(device if device is not None else "cpu")
    return device.type == "cuda" and dtype in HALF_DTYPES and _varlen_fn() is not None


def _make_by_length_backend() -> AttentionBackend:
    varlen, cudnn = _make_varlen_backend(), _make_cudnn_backend()

    def by_length_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        cu_seqlens_host: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        if cu_seqlens_host is not None and max_seqlen >= CUDNN_MIN_LENGTH and all(
                end - start >= CUDNN_MIN_LENGTH for start, end in zip(cu_seqlens_host[:-1], cu_seqlens_host[1:])):
            return cudnn(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host)
        return varlen(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host)

    return by_length_attention


class _Run(NamedTuple):
    """Sequences [first, end) of a row, all of at least `CUDNN_MIN_LENGTH` tokens (long) or all shorter."""
    long: bool
    first: int
    end: int


def _length_runs(bounds: tuple[int, ...]) -> list[_Run]:
    """The maximal runs of consecutive sequences of the host `bounds`, in row order, covering every
    sequence once (none for a row of no sequence); neighbouring runs differ in `long`."""
    runs: list[_Run] = []
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        long = end - start >= CUDNN_MIN_LENGTH
        if runs and runs[-1].long == long:
            runs[-1] = runs[-1]._replace(end=i + 1)
        else:
            runs.append(_Run(long, i, i + 1))
    return runs


def _make_by_length_runs_backend() -> AttentionBackend:
    varlen, cudnn = _make_varlen_backend(), _make_cudnn_backend()

    def by_length_runs_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        cu_seqlens_host: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        runs = [] if cu_seqlens_host is None else _length_runs(cu_seqlens_host)
        if len(runs) <= 1:  # one backend for the whole row: the call "by_length" makes
            backend = cudnn if runs and runs[0].long else varlen
            return backend(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host)
        outs = []
        for long, first, end in runs:
            start, stop = cu_seqlens_host[first], cu_seqlens_host[end]
            run_host = tuple(b - start for b in cu_seqlens_host[first:end + 1])
            # shifted on the device by its own first entry: reading cu_seqlens here would sync
            run_cu = cu_seqlens[first:end + 1]
            run_cu = run_cu - run_cu[0]
            longest = max(b - a for a, b in zip(run_host[:-1], run_host[1:]))
            backend = cudnn if long else varlen
            outs.append(backend(q[start:stop], k[start:stop], v[start:stop], run_cu, longest, run_host))
        return torch.cat(outs, dim=0)

    return by_length_runs_attention


def resolve_backend_name(name: str, device: torch.device | str | None, dtype: torch.dtype | None) -> str:
    """Turn "auto" into "by_length" (CUDA, bf16/fp16, varlen kernel present) or "sdpa"; check the
    name and what the named backend needs."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"attention backend {name!r}: expected one of {BACKEND_NAMES}")
    if name == "auto":
        return "by_length" if varlen_available(device, dtype) else "sdpa"
    if name in ("varlen", "by_length", "by_length_runs") and _varlen_fn() is None:
        raise ValueError(
            f"attention backend {name!r} needs torch.nn.attention.varlen (torch {torch.__version__} lacks it)"
        )
    device_type = torch.device(device if device is not None else "cpu").type
    # a model built on meta is filled later: its loader (`hf_io.decoder_from_hf`) resolved the name for
    # the real device first
    if name in ("cudnn", "by_length", "by_length_runs") and (
            device_type not in ("cuda", "meta") or dtype not in HALF_DTYPES):
        raise ValueError(f"attention backend {name!r} needs a CUDA device and bf16/fp16 compute, got device "
                         f"{device_type} and compute dtype {dtype} (use 'auto' or 'sdpa' there)")
    return name


def make_backend(name: str) -> AttentionBackend:
    """The backend function for a resolved name ("sdpa", "varlen", "cudnn", "by_length" or "by_length_runs")."""
    if name == "by_length":
        return _make_by_length_backend()
    if name == "by_length_runs":
        return _make_by_length_runs_backend()
    if name == "varlen":
        return _make_varlen_backend()
    if name == "cudnn":
        return _make_cudnn_backend()
    return sdpa_attention
