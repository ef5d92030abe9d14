"""Trajectory selection after judging (reference 4.5): one (correct, incorrect) pair per prompt.

The official trainer splits the generated samples into consecutive groups of ``k``, drops every
group whose samples are all correct or all incorrect, and keeps from each other group one random
correct then one random incorrect sample. The draws come from a ``random.Random``-like object
(the trainer passes Python's global ``random`` module, seeded as the official run seeds it, so
the kept pairs reproduce the official ones). Without the filter every sample is kept.
Invariant: indices refer to the input order; pairs appear in group order, correct first.
Pure Python on host floats: this runs once per step on at most a few thousand rewards.
"""

from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

T = TypeVar("T")


def is_correct(reward: float) -> bool:
    """Correct means reward > 0. The official filter tests reward == 1; on its rewards, +1 or -1, the
    two agree, and > 0 is what its loss tests (the positive term, the token normalisers), so a
    reward_fn's float rewards (docs/rewards.md) split the same way in the filter and in the loss."""
    return reward > 0


class ChoiceRng(Protocol):
    def choice(self, seq: Sequence[T]) -> T: ...


@dataclass(frozen=True)
class Selection:
    """Kept samples of one step.

    Attributes:
        indices: kept sample indices into the generated list, in training order.
    """

    indices: list[int]


def _check(rewards: Sequence[float], k: int) -> None:
    if k < 1 or len(rewards) % k != 0:
        raise ValueError(
            f"number of rewards ({len(rewards)}) must be a multiple of prompt_repeat_k ({k})"
        )


def group_pass_rates(rewards: Sequence[float], k: int) -> list[float]:
    """Fraction of correct samples (reward > 0) in each consecutive group of ``k``."""
    _check(rewards, k)
    return [
        sum(1 for r in rewards[g : g + k] if is_correct(r)) / k
        for g in range(0, len(rewards), k)
    ]


def filter_one_pair(rewards: Sequence[float], k: int, rng: ChoiceRng) -> Selection:
    """Keep one random correct and one random incorrect sample of every mixed group.

    Per group: ``rng.choice(correct)`` then ``rng.choice(incorrect)``, both lists in input
    order; groups with pass rate 0 or 1 are dropped and consume no draws.

    Args:
        rewards: ``N`` judger rewards, groups of ``k`` contiguous.
        k: samples per prompt.
        rng: anything with ``choice`` (``random`` or ``random.Random(seed)``).

    Returns:
        The kept ``Selection`` (``2 * #mixed groups`` samples, possibly empty).
    """
    rates = group_pass_rates(rewards, k)
    indices: list[int] = []
    for g, p in enumerate(rates):
        if p in (0.0, 1.0):
            continue
        members = range(g * k, (g + 1) * k)
        correct = [i for i in members if is_correct(rewards[i])]
        incorrect = [i for i in members if not is_correct(rewards[i])]
        indices += [rng.choice(correct), rng.choice(incorrect)]
    return Selection(indices)


def keep_all(rewards: Sequence[float], k: int) -> Selection:
    """The ``filter_trajectory=False`` path: every sample, in order, no draws."""
    _check(rewards, k)
    return Selection(list(range(len(rewards))))


def select_trajectories(
    rewards: Sequence[float], k: int, rng: ChoiceRng, filter_trajectory: bool
) -> Selection:
    """``filter_one_pair`` if the config's ``filter_trajectory`` is set, else ``keep_all``."""
    return filter_one_pair(rewards, k, rng) if filter_trajectory else keep_all(rewards, k)
