"""One sample being generated: its prompt, how far it got, its KV blocks, and groups of samples
that share one prompt.

A `Sequence` is host bookkeeping only: the tokens it generates live on the device in the model
runner's output buffer (row `out_row`), so the host never reads a token while generating. The
host knows every length without reading tokens, because each decode step adds exactly one token
to every running sequence.

Not here: which blocks are free (`block_manager`), when a sequence runs (`scheduler`), tensors.
Invariant: block i of `block_table` holds positions [i * block_size, (i + 1) * block_size); a
running sequence has `num_new >= 1` tokens, the last of which is *pending* (sampled, its k/v not
yet in the cache), so its first `length - 1` tokens are cached.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(enum.Enum):
    WAITING = "waiting"  # not in the cache: never prefilled, or preempted (to be recomputed)
    RUNNING = "running"  # in the decode batch
    FINISHED = "finished"  # stopped; its blocks are back in the pool


@dataclass
class Sequence:
    """One sample (one response of one prompt).

    `out_row` is the sample's index in `generate`'s output order and its row in the runner's
    device buffer of generated tokens; `admit_order` grows with each admission (a recomputed
    sequence gets a new one), and preemption takes the largest first.
    """

    out_row: int
    prompt: list[int]
    limit: int  # new tokens allowed: min(max_new_tokens, max_length - prompt length)
    num_new: int = 0  # tokens generated so far (the pending one included)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    admit_order: int | None = None  # set by the scheduler at each admission, None before the first

    @property
    def num_prompt(self) -> int:
        return len(self.prompt)

    @property
    def length(self) -> int:
        """Prompt + generated tokens (the pending one included)."""
        return len(self.prompt) + self.num_new


@dataclass
class PromptGroup:
    """Samples of one prompt not yet started: prefilled once, then forked into `len(members)`
    sequences that share the prompt's full blocks."""

    prompt: list[int]
    members: list[Sequence]

    def split(self, n: int) -> "PromptGroup":
        """Take the first n members into a group of their own (the rest stay here)."""
        head, self.members = self.members[:n], self.members[n:]
        return PromptGroup(self.prompt, head)


def group_prompts(prompts: list[list[int]], limits: list[int]) -> list[PromptGroup]:
    """Samples with identical prompt token lists, grouped in order of first appearance.

    Args:
        prompts: one token list per sample (the k samples of a prompt are k equal lists).
        limits: new-token limit of each sample.

    Returns:
        The groups; member i of a group keeps its position in `prompts` as `out_row`.
    """
    groups: dict[tuple[int, ...], PromptGroup] = {}
    for row, (prompt, limit) in enumerate(zip(prompts, limits)):
        key = tuple(prompt)
        if key not in groups:
            groups[key] = PromptGroup(list(prompt), [])
        groups[key].members.append(Sequence(out_row=row, prompt=groups[key].prompt, limit=limit))
    return list(groups.values())
