"""Token-level reward model: its sequence BCE loss and the per-token importance weights (4.10).

The RM scores every action token (``s``, one logit per token, from the hidden state before
the token). Its training signal is sequence level: the BCE of the mean score against the
outcome. The actor's token weights come from the running mean of the scores (detached).
All tensors are packed (see ``normalisers``); sequences are handled with segment ops, no
Python loop over tokens or sequences. Every response has at least one action token.

Where we differ from the official trainer:
1. The cumulative means are computed in fp32 (an fp64 scan subtracted per segment) where the
   official code scans in bf16 and rounds every partial sum (about 0.4 % relative error over
   10^4 tokens); weights therefore differ from the official ones by bf16 noise only.
2. ``topk_rescale`` keeps at least one token per sequence (K = max(int(R * ratio), 1)) where
   the official code crashes on K = 0, and a selection whose values are all equal gets weight
   1 (the official min-max would divide by 0). Among tied values the earliest tokens are
   selected (torch.topk leaves the choice unspecified).
Invariant: weights are in [0, 1], detached, fp32, in packed token order.
"""

import torch
import torch.nn.functional as F

from oreal_fast.algo.normalisers import safe_denominator, segment_ids


def cumulative_means(scores: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Running mean of the RM scores within each sequence: ``c_t = mean(s_0..s_t)``.

    Args:
        scores: ``[T]`` RM logits of the action tokens, any float dtype.
        cu_seqlens: ``[M + 1]`` int, packed sequence boundaries.

    Returns:
        ``[T]`` fp32, detached.
    """
    s = scores.detach().double()
    t = s.numel()
    seg = segment_ids(cu_seqlens, t)
    starts = cu_seqlens.long()[seg]
    csum = torch.cat([s.new_zeros(1), torch.cumsum(s, 0)])
    count = torch.arange(1, t + 1, device=s.device) - starts
    return ((csum[1:] - csum[starts]) / count).float()


def sequence_means(scores: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Mean RM score of each sequence, ``m_i = (1/R_i) sum_t s_t``, differentiable.

    Args:
        scores: ``[T]`` RM logits (with grad).
        cu_seqlens: ``[M + 1]`` int.

    Returns:
        ``[M]`` fp32.
    """
    seg = segment_ids(cu_seqlens, scores.numel())
    lens = cu_seqlens.diff().float()
    sums = scores.new_zeros(lens.numel(), dtype=torch.float32).index_add(0, seg, scores.float())
    return sums / lens


def rm_bce_loss(
    seq_means: torch.Tensor, rewards: torch.Tensor, num_seqs: torch.Tensor
) -> torch.Tensor:
    """This micro-batch's share of ``L_rm = (1/M) sum_i BCEWithLogits(m_i, y_i)``.

    Normaliser: M, the number of kept trajectories of the whole step, so the shares of all
    micro-batches (and ranks) SUM to L_rm. Target ``y_i = int(max(r_i, 0))`` (1 iff r = +1).

    Args:
        seq_means: ``[M_mb]`` fp32 mean RM logit per sequence (with grad).
        rewards: ``[M_mb]`` float judger rewards.
        num_seqs: 0-d, global M.

    Returns:
        0-d fp32 loss (with grad).
    """
    y = rewards.float().clamp(min=0).trunc()
    bce = F.binary_cross_entropy_with_logits(seq_means, y, reduction="sum")
    return bce / safe_denominator(num_seqs)


def _check_threshold(name: str, tau: float) -> None:
    if not 0.0 <= tau < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {tau}")


def threshold_weights(
    cum_means: torch.Tensor, correct_threshold: float, incorrect_threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``threshold_rescale``: probabilities above a threshold, rescaled to [0, 1].

    ``w+ = clamp((sigmoid(c) - tau+) / (1 - tau+), 0, 1)``,
    ``w- = clamp(((1 - sigmoid(c)) - tau-) / (1 - tau-), 0, 1)``. At tau = 0.5 at most one of
    the two is non-zero per token.

    Args:
        cum_means: ``[T]`` fp32 running means (``cumulative_means``).
        correct_threshold: tau+ in [0, 1).
        incorrect_threshold: tau- in [0, 1).

    Returns:
        ``(w_pos [T], w_neg [T])`` fp32.
    """
    _check_threshold("correct_threshold", correct_threshold)
    _check_threshold("incorrect_threshold", incorrect_threshold)
    p = torch.sigmoid(cum_means.float())
    w_pos = ((p - correct_threshold) / (1 - correct_threshold)).clamp(0, 1)
    w_neg = (((1 - p) - incorrect_threshold) / (1 - incorrect_threshold)).clamp(0, 1)
    return w_pos, w_neg


def _topk_minmax(q: torch.Tensor, cu_seqlens: torch.Tensor, ratio: float) -> torch.Tensor:
    """Per sequence: min-max of its top-K values of ``q`` (others 0), K = max(int(R*ratio), 1)."""
    t = q.numel()
    cu = cu_seqlens.long()
    seg = segment_ids(cu, t)
    # Sort by value (descending), then stably by sequence: each segment ends up sorted in place.
    by_value = torch.argsort(q, descending=True, stable=True)
    order = by_value[torch.argsort(seg[by_value], stable=True)]
    q_sorted = q[order]
    rank = torch.arange(t, device=q.device) - cu[seg]
    # R * ratio in fp64 equals the official Python float product; int() truncates.
    k = (cu.diff().double() * ratio).floor().long().clamp(min=1)
    hi = q_sorted[cu[:-1]]
    lo = q_sorted[cu[:-1] + k - 1]
    span = (hi - lo)[seg]
    safe_span = span.clamp(min=torch.finfo(q.dtype).tiny)
    scaled = torch.where(span > 0, (q_sorted - lo[seg]) / safe_span, 1.0)
    w_sorted = torch.where(rank < k[seg], scaled, 0.0)
    return torch.empty_like(q).index_put_((order,), w_sorted)


def topk_weights(
    cum_means: torch.Tensor,
    cu_seqlens: torch.Tensor,
    correct_topk_ratio: float,
    incorrect_topk_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_rescale``: per sequence, the top ``ratio`` share of tokens by probability,
    min-max normalised to [0, 1]; the others 0 (see the module docstring for K and ties).

    Args:
        cum_means: ``[T]`` fp32 running means.
        cu_seqlens: ``[M + 1]`` int.
        correct_topk_ratio: share of tokens ranked by ``sigmoid(c)`` for ``w+``.
        incorrect_topk_ratio: share ranked by ``1 - sigmoid(c)`` for ``w-``.

    Returns:
        ``(w_pos [T], w_neg [T])`` fp32.
    """
    p = torch.sigmoid(cum_means.float())
    w_pos = _topk_minmax(p, cu_seqlens, correct_topk_ratio)
    return w_pos, _topk_minmax(1 - p, cu_seqlens, incorrect_topk_ratio)


def rm_token_weights(
    cum_means: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    threshold_rescale: bool,
    correct_threshold: float,
    incorrect_threshold: float,
    topk_rescale: bool,
    correct_topk_ratio: float,
    incorrect_topk_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The config's weight mapping; ``threshold_rescale`` wins when both flags are set.

    Without a token RM there are no weights: pass ``None`` to the actor loss (weight 1).

    Returns:
        ``(w_pos [T], w_neg [T])`` fp32, detached.
    """
    if threshold_rescale:
        return threshold_weights(cum_means, correct_threshold, incorrect_threshold)
    if topk_rescale:
        return topk_weights(cum_means, cu_seqlens, correct_topk_ratio, incorrect_topk_ratio)
    raise ValueError("a token_level_rm needs threshold_rescale=True or topk_rescale=True")
