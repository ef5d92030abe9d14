"""Next-token sampling from logits by inverse CDF on one uniform draw per row (reference 4.2).

This file holds the eager twin only; `impl="triton"` runs it too until the Triton kernel lands.
Randomness comes from the caller's uniforms, so a kernel and its twin pick the same token.
Invariant: the picked token is always one the temperature / top-k / top-p rule keeps.
"""

from __future__ import annotations

import torch

IMPLS = ("triton", "eager")


def sample_from_logits_eager(
    logits: torch.Tensor, uniform: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0,
    top_p: float = 1.0, impl: str = "eager",
) -> torch.Tensor:
    """Filter as `oreal_fast.rollout.sampling.filter_logits`, then the first index (in vocabulary
    order) whose running kept probability exceeds uniform * kept mass.

    Args:
        logits: [B, V] float logits.
        uniform: [B] fp32 in [0, 1), one draw per row.
        temperature, top_k, top_p: the sampling rule (top_k 0 and top_p 1 are off).
        impl: unused; the twin's signature matches `sample_from_logits`.

    Returns:
        [B] int64 token ids.
    """
    from oreal_fast.rollout.base import SamplingParams  # the rollout package imports this module
    from oreal_fast.rollout.sampling import filter_logits

    rule = SamplingParams(max_new_tokens=1, max_length=2, top_k=top_k, top_p=top_p, temperature=temperature)
    probs = filter_logits(logits.float(), rule).softmax(dim=-1)  # (B, V), 0 where filtered out
    cum = probs.cumsum(dim=-1)
    target = (uniform.float() * cum[:, -1])[:, None]
    picked = torch.searchsorted(cum, target, right=True)[:, 0]  # first i with cum[i] > target
    # rounding can put the target at the total: fall back to the last kept index
    V = logits.shape[-1]
    last_kept = V - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.minimum(picked, last_kept)


def sample_from_logits(
    logits: torch.Tensor, uniform: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0,
    top_p: float = 1.0, impl: str = "triton",
) -> torch.Tensor:
    """One token per row (see the eager twin); `impl` is "triton" or "eager"."""
    if impl not in IMPLS:
        raise ValueError(f"sample_from_logits impl {impl!r}: expected one of {IMPLS}")
    return sample_from_logits_eager(logits, uniform, temperature=temperature, top_k=top_k, top_p=top_p)
