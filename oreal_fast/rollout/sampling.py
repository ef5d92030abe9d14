"""Next-token sampling exactly as the official trainer (reference 4.2).

Order: greedy argmax if not do_sample; else divide by temperature (if != 1), top-k (if > 0),
top-p (if < 1: sort ascending, softmax, cumulative sum, drop every sorted position whose
cumulative probability is <= 1 - top_p, never the most likely token), softmax, multinomial.
This is also the rule of transformers' TopK/TopP warpers.

We filter and softmax in fp32 (the official engine does it on bf16 logits): the sampled
distribution is the same up to bf16 rounding of the probabilities, which the reference says
need not be matched bit for bit (section 8.12). Randomness comes only from the passed generator.
"""

from __future__ import annotations

import torch

from oreal_fast.rollout.base import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p; removed entries become -inf.

    Args:
        logits: [B, V] float logits of the next token.
        params: uses temperature, top_k, top_p.

    Returns:
        [B, V] filtered logits, same dtype (a new tensor).
    """
    if params.temperature != 1.0:
        logits = logits / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # ties with the k-th value are kept
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= 1.0 - params.top_p
        drop_sorted[..., -1] = False  # the most likely token always survives
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return logits


def sample_next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Pick one token per row.

    Args:
        logits: [B, V] logits of the next token (any float dtype).
        params: the sampling settings.
        generator: torch.Generator on logits' device (unused when greedy).

    Returns:
        [B] int64 token ids.
    """
    if not params.do_sample:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits.float(), params).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
