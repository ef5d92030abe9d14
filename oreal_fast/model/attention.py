"""Causal attention over packed varlen rows.

A backend is a function `(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], cu_seqlens [N+1] int32,
max_seqlen) -> out [T, Hq, D]` computing causal softmax attention inside each packed sequence.
The decoder picks one backend at construction (`resolve_backend_name`, `make_backend`); every backend gives the same
result up to rounding, which the tests check against each other.

- "sdpa": `scaled_dot_product_attention` once per sequence. Correct on every device and dtype;
  it reads `cu_seqlens` on the host, so it syncs once per layer (fine for CPU and tests).
- "varlen": torch's flash varlen kernel (`torch.nn.attention.varlen.varlen_attn`), CUDA with
  bf16/fp16 only. Its keyword set moved between torch releases (`is_causal` vs `window_size`,
  `enable_gqa`), so the call is adapted once from its signature.

This module does not do KV caches: generation passes its own cache object to `Decoder.forward`
(`oreal_fast.rollout`).
Invariant: attention never crosses a `cu_seqlens` boundary.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
import torch.nn.functional as F

AttentionBackend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]

BACKEND_NAMES = ("auto", "sdpa", "varlen")


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """Causal attention per packed sequence with SDPA (any device, any dtype).

    Args:
        q: [T, Hq, D]; k, v: [T, Hkv, D] with Hq a multiple of Hkv.
        cu_seqlens: [N+1] int32, cumulative sequence starts (0 first, T last).
        max_seqlen: unused here; part of the backend signature.

    Returns:
        out: [T, Hq, D], same dtype as q.
    """
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        # (1, heads, n, D) per sequence
        qi, ki, vi = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True)
        outs.append(oi.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


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
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
    ) -> torch.Tensor:
        if not native_gqa and k.shape[1] != q.shape[1]:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (T, Hq, D)
        return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **causal)

    return varlen_attention


def varlen_available(device: torch.device | str | None, dtype: torch.dtype | None) -> bool:
    """True when the flash varlen kernel can run for this device and dtype."""
    device = torch.device(device if device is not None else "cpu")
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _varlen_fn() is not None


def resolve_backend_name(name: str, device: torch.device | str | None, dtype: torch.dtype | None) -> str:
    """Turn "auto" into "varlen" (CUDA, bf16/fp16, kernel present) or "sdpa"; check the name."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"attention backend {name!r}: expected one of {BACKEND_NAMES}")
    if name == "auto":
        return "varlen" if varlen_available(device, dtype) else "sdpa"
    if name == "varlen" and _varlen_fn() is None:
        raise ValueError(
            f"attention backend 'varlen' needs torch.nn.attention.varlen (torch {torch.__version__} lacks it)"
        )
    return name


def make_backend(name: str) -> AttentionBackend:
    """The backend function for a resolved name ("sdpa" or "varlen")."""
    return _make_varlen_backend() if name == "varlen" else sdpa_attention
