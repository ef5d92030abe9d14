"""Global loss normalisers of one RL step (reference 4.7) and packed-segment helpers.

The normalisers are counted once over the whole kept list, before any micro-batch runs, and
every micro-batch divides its local sums by them; summing the micro-batch losses (and, with
data parallelism, the ranks' losses, with no gradient averaging) then gives the global loss.
Invariant: they stay 0-d tensors on the device; nothing here syncs with the host.

Per-token tensors in this package are *packed*: the action tokens of all sequences of a
micro-batch concatenated, sequence ``i`` owning ``[cu_seqlens[i], cu_seqlens[i + 1])``.
"""

from typing import NamedTuple

import torch

# A denominator floor: a normaliser can only be 0 when its numerator sums over no tokens
# (e.g. no positive sample kept), so dividing by 1 instead returns the exact 0 rather than NaN.
MIN_NORMALISER = 1


class Normalisers(NamedTuple):
    """Global counts over the kept trajectories, 0-d int64 tensors.

    Attributes:
        num_action: N_act, sum of response lengths R_i.
        num_positive: N_pos, sum of R_i over samples with reward > 0.
        num_negative: N_neg = N_act - N_pos (reward <= 0).
        num_seqs: M, number of kept trajectories.
    """

    num_action: torch.Tensor
    num_positive: torch.Tensor
    num_negative: torch.Tensor
    num_seqs: torch.Tensor


def global_normalisers(response_lens: torch.Tensor, rewards: torch.Tensor) -> Normalisers:
    """Count N_act, N_pos, N_neg and M over the kept list.

    Args:
        response_lens: ``[M]`` int, action tokens R_i of each kept sample (stop token included).
        rewards: ``[M]`` float, judger rewards of the same samples.

    Returns:
        ``Normalisers`` of 0-d int64 tensors on ``response_lens.device``.
    """
    lens = response_lens.long()
    n_act = lens.sum()
    n_pos = (lens * (rewards > 0)).sum()
    n_seqs = torch.full((), lens.numel(), dtype=torch.int64, device=lens.device)  # a fill, not a blocking copy
    return Normalisers(n_act, n_pos, n_act - n_pos, n_seqs)


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32, or kept in fp64: the losses compute in fp32, and in fp64 when the model's
    outputs are fp64 (the CPU tests that compare two micro-batch splits to summation order)."""
    return x if x.dtype == torch.float64 else x.float()


def safe_denominator(n: torch.Tensor) -> torch.Tensor:
    """``n`` as fp32, floored at ``MIN_NORMALISER`` (see there)."""
    return n.float().clamp(min=MIN_NORMALISER)


def segment_ids(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Sequence index of every packed token.

    Args:
        cu_seqlens: ``[M + 1]`` int, starts 0, ends ``num_tokens``.
        num_tokens: T, the packed length (a host int, so no device sync).

    Returns:
        ``[T]`` int64 in ``[0, M)``.
    """
    positions = torch.arange(num_tokens, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), positions, right=True)

