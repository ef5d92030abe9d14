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
   the official code crashes on K = 0. As in the official code, a selection whose values are
   all equal gets weight 1. Among tied values the earliest tokens are selected (torch.topk
   leaves the choice unspecified).
3. ``topk_rescale``'s min-max of probabilities is computed exactly from the logits (fp64, log
   space) where the official code subtracts bf16 sigmoids. For a confident RM the sigmoids
   sit within a few ulps of 1 and their differences are mostly rounding: running means 10,
   11, 12 give the middle token 0.7325 from fp32 sigmoids (1.0 at 16, 17, 18) for the exact
   0.7311 = sigmoid(1).
Invariant: weights are in [0, 1], detached, fp32 (fp64 for fp64 scores), in packed token order.
"""

import torch
import torch.nn.functional as F

from oreal_fast.algo.normalisers import at_least_fp32, safe_denominator, segment_ids


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
    return ((csum[1:] - csum[starts]) / count).to(at_least_fp32(scores).dtype)


def sequence_means(scores: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Mean RM score of each sequence, ``m_i = (1/R_i) sum_t s_t``, differentiable.

    Args:
        scores: ``[T]`` RM logits (with grad).
        cu_seqlens: ``[M + 1]`` int.

    Returns:
        ``[M]`` fp32.
    """
    seg = segment_ids(cu_seqlens, scores.numel())
    scores = at_least_fp32(scores)
    lens = cu_seqlens.diff().to(scores.dtype)
    sums = scores.new_zeros(lens.numel()).index_add(0, seg, scores)
    return sums / lens


def rm_bce_loss(
    seq_means: torch.Tensor, rewards: torch.Tensor, num_seqs: torch.Tensor
) -> torch.Tensor:
    """This micro-batch's share of ``L_rm = (1/M) sum_i BCEWithLogits(m_i, y_i)``.

    Normaliser: M, the number of kept trajectories of the whole step, so the shares of all
    micro-batches (and ranks) SUM to L_rm. Target ``y_i = 1`` iff ``r_i > 0`` (correct, as the filter
    and the loss read it); the official ``int(max(r_i, 0))`` is the same on its rewards of +1 / -1.

    Args:
        seq_means: ``[M_mb]`` fp32 mean RM logit per sequence (with grad).
        rewards: ``[M_mb]`` float judger rewards.
        num_seqs: 0-d, global M.

    Returns:
        0-d fp32 loss (with grad).
    """
    y = (rewards > 0).to(seq_means.dtype)
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
    p = torch.sigmoid(at_least_fp32(cum_means))
    w_pos = ((p - correct_threshold) / (1 - correct_threshold)).clamp(0, 1)
    w_neg = (((1 - p) - incorrect_threshold) / (1 - incorrect_threshold)).clamp(0, 1)
    return w_pos, w_neg


def _sigmoid_minmax(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``(sigmoid(x) - sigmoid(lo)) / (sigmoid(hi) - sigmoid(lo))`` for ``lo <= x <= hi``, fp64.

    Uses ``sigmoid(a) - sigmoid(b) = expm1(a - b) sigmoid(b) sigmoid(-a)`` (a >= b), a product
    without cancellation, in log space so that no factor over- or underflows; 1 where hi == lo.
    """
    u, v = x - lo, hi - lo
    log_w = (u - v) + torch.log(-torch.expm1(-u)) - torch.log(-torch.expm1(-v))
    log_w = log_w + F.logsigmoid(-x) - F.logsigmoid(-hi)
    return torch.where(v > 0, torch.exp(log_w).clamp(max=1.0), 1.0)


def _topk_minmax(x: torch.Tensor, cu_seqlens: torch.Tensor, ratio: float) -> torch.Tensor:
    """Per sequence: min-max of ``sigmoid(x)`` over its top-K values of ``x`` (others 0),
    K = max(int(R*ratio), 1). ``x``: ``[T]`` fp64 logits; returns ``[T]`` fp64.

    sigmoid is increasing, so ranking the logits ranks the probabilities, without the ties
    that saturated probabilities would create.
    """
    t = x.numel()
    cu = cu_seqlens.long()
    seg = segment_ids(cu, t)
    # Sort by value (descending), then stably by sequence: each segment ends up sorted in place.
    by_value = torch.argsort(x, descending=True, stable=True)
    order = by_value[torch.argsort(seg[by_value], stable=True)]
    x_sorted = x[order]
    rank = torch.arange(t, device=x.device) - cu[seg]
    # R * ratio in fp64 equals the official Python float product; int() truncates.
    k = (cu.diff().double() * ratio).floor().long().clamp(min=1)
    hi = x_sorted[cu[:-1]][seg]
    lo = x_sorted[cu[:-1] + k - 1][seg]
    selected = rank < k[seg]
    # Unselected tokens (x < lo) give NaN inside _sigmoid_minmax; the where discards them.
    w_sorted = torch.where(selected, _sigmoid_minmax(x_sorted, lo, hi), 0.0)
    return torch.empty_like(x).index_put_((order,), w_sorted)


def topk_weights(
    cum_means: torch.Tensor,
    cu_seqlens: torch.Tensor,
    correct_topk_ratio: float,
    incorrect_topk_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_rescale``: per sequence, the top ``ratio`` share of tokens by probability,
    min-max normalised to [0, 1]; the others 0 (see the module docstring for K, ties and the
    exact min-max).

    Args:
        cum_means: ``[T]`` fp32 running means.
        cu_seqlens: ``[M + 1]`` int.
        correct_topk_ratio: share of tokens ranked by ``p+ = sigmoid(c)`` for ``w+``.
        incorrect_topk_ratio: share ranked by ``p- = 1 - sigmoid(c) = sigmoid(-c)`` for ``w-``.

    Returns:
        ``(w_pos [T], w_neg [T])`` fp32.
    """
    c = cum_means.detach().double()
    w_pos = _topk_minmax(c, cu_seqlens, correct_topk_ratio)
    w_neg = _topk_minmax(-c, cu_seqlens, incorrect_topk_ratio)
    return w_pos.to(at_least_fp32(cum_means).dtype), w_neg.to(at_least_fp32(cum_means).dtype)


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
