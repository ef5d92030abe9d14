"""Which prompts each step uses: the official seeded permutation and batching (reference 3.4, 3.5).

The official trainer draws its shuffle seed the way mmengine's ``sync_random_seed`` does: after
numpy's global RNG is seeded with ``seed``, the first ``np.random.randint(2**31)`` (209652396 for
seed 0). The order is ``torch.randperm(N, generator=torch.Generator().manual_seed(shuffle_seed))``,
repeated cyclically up to a whole number of batches; step b takes entries [P*b, P*b + P).
What this module does not do: load or tokenise records.

Invariant: ``batch(step)`` depends only on (num_records, prompts_per_step, seed, step), so a
resumed run that restores the step counter sees exactly the prompts a straight run would.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np
import torch

T = TypeVar("T")


def shuffle_seed_for(seed: int) -> int:
    """The sampler seed the official trainer derives from the global ``seed``.

    A fresh ``RandomState(seed)`` gives the same stream as numpy's global RNG right after
    ``np.random.seed(seed)``, without touching global state.
    """
    return int(np.random.RandomState(seed).randint(2**31))


class PromptSampler:
    """Seeded permutation of record indices, cut into per-step batches.

    Args:
        num_records: N, the balanced dataset length.
        prompts_per_step: P = gen_global_batch // prompt_repeat_k.
        seed: the run's global seed.

    Attributes:
        shuffle_seed: the torch generator seed.
        permutation: [N] int64, torch.randperm(N) under that seed.
        num_steps: ceil(N / P), the number of batches (total_steps is capped at it).
    """

    def __init__(self, num_records: int, prompts_per_step: int, seed: int):
        if num_records < 1:
            raise ValueError("no prompt records to sample from (is the balanced dataset empty?)")
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        self.num_records = num_records
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.shuffle_seed = shuffle_seed_for(seed)
        # epoch is always 0 in the official run, so the generator seed is shuffle_seed + 0
        generator = torch.Generator().manual_seed(self.shuffle_seed)
        self.permutation = torch.randperm(num_records, generator=generator)
        self.num_steps = math.ceil(num_records / prompts_per_step)

    def batch(self, step: int) -> list[int]:
        """Record indices of step ``step`` (0-based), P of them, wrapping around the permutation."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} is outside 0..{self.num_steps - 1}")
        start = step * self.prompts_per_step
        positions = torch.arange(start, start + self.prompts_per_step) % self.num_records
        return self.permutation[positions].tolist()

    def state_dict(self) -> dict[str, Any]:
        """What identifies the order; the step counter itself belongs to the trainer."""
        return {"num_records": self.num_records, "prompts_per_step": self.prompts_per_step,
                "seed": self.seed, "shuffle_seed": self.shuffle_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Checks that a checkpoint was made with the same order; raises ValueError if not."""
        mine = self.state_dict()
        diff = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if diff:
            raise ValueError("the checkpoint's prompt order differs from this run's (saved, now): "
                             + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in diff.items()))


def repeat_k(items: list[T], k: int) -> list[T]:
    """Repeats each item k times consecutively: [A, B] -> [A]*k + [B]*k (reference 3.5)."""
    return [item for item in items for _ in range(k)]
