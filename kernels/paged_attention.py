"""Decode attention over a paged KV cache: one query token per sequence, keys and values read
through a block table.

This file holds the eager twin only; `impl="triton"` runs it too until the Triton kernel lands.
Not here: writing k/v into the cache (the rollout engine does that before calling).
Invariant: the result depends only on each sequence's first `context_lens` cached tokens; block
table entries past them are never read for the output (they must still be valid block ids).
"""

from __future__ import annotations

import torch

IMPLS = ("triton", "eager")


def paged_decode_attention_eager(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, *, scale: float | None = None, impl: str = "eager",
) -> torch.Tensor:
    """Gather every block of the table, mask past `context_lens`, softmax in fp32.

    Args:
        q: [B, Hq, D] one query per sequence.
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], q's dtype.
        block_tables: [B, max_blocks] int32 block ids in sequence order.
        context_lens: [B] int32 >= 1, cached tokens per sequence (the current one included).
        scale: softmax scale, default D ** -0.5.
        impl: unused; the twin's signature matches `paged_decode_attention`.

    Returns:
        [B, Hq, D] in q's dtype. Shapes depend only on the arguments' shapes (no host sync).
    """
    B, Hq, D = q.shape
    _, block_size, Hkv, _ = k_cache.shape
    scale = D ** -0.5 if scale is None else scale
    blocks = block_tables.long()
    S = blocks.shape[1] * block_size
    k = k_cache[blocks].reshape(B, S, Hkv, D).float()  # (B, S, Hkv, D)
    v = v_cache[blocks].reshape(B, S, Hkv, D).float()
    qg = q.float().view(B, Hkv, Hq // Hkv, D)  # query heads grouped by their KV head
    scores = torch.einsum("bhgd,bshd->bhgs", qg, k) * scale  # (B, Hkv, G, S)
    visible = torch.arange(S, device=q.device)[None, :] < context_lens[:, None]  # (B, S)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgs,bshd->bhgd", scores.softmax(dim=-1), v)
    return out.reshape(B, Hq, D).to(q.dtype)


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, *, scale: float | None = None, impl: str = "triton",
) -> torch.Tensor:
    """Softmax attention of each sequence's query over its cached context (see the eager twin for
    shapes); `impl` is "triton" or "eager"."""
    if impl not in IMPLS:
        raise ValueError(f"paged_decode_attention impl {impl!r}: expected one of {IMPLS}")
    return paged_decode_attention_eager(q, k_cache, v_cache, block_tables, context_lens, scale=scale)
