"""Trajectories and RL micro-batches (reference 4.6 and 4.8).

A trajectory is one prompt's token ids plus one sampled response (stop token kept). Its labels are
pre-shifted as the official trainer's: ``[-100] * (P - 1) + response + [-100]``, so the last prompt
position predicts the first response token and the final position predicts nothing.

Micro-batches take the kept trajectories in kept order. The official split packs ``rl_mirco_batch``
trajectories per micro-batch; with a token budget (``rl_micro_batch_tokens``) consecutive
trajectories are packed until the next one would pass the budget (one longer than the budget goes
alone). Every loss term is divided by the step's global counts, so any split gives the same loss and
gradient up to floating-point summation order (docs/differences.md).

Invariant: the action tokens of a micro-batch (labels != -100) appear in packed order, so the
per-token tensors of the loss are the concatenation of each trajectory's R response tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from oreal_fast.data.packing import PackedRow, pack_sequences

IGNORE_INDEX = -100


@dataclass
class Trajectory:
    """One generated sample: prompt + response ids, its reward and RLOO/GRPO advantage, and the
    rollout engine's log-prob of each response token ([R] fp32; None from a scripted engine)."""

    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    advantage: float
    rollout_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.rollout_logprobs is not None and self.rollout_logprobs.shape != (len(self.response_ids),):
            raise ValueError(f"Trajectory: rollout_logprobs has shape {tuple(self.rollout_logprobs.shape)}, "
                             f"the response {len(self.response_ids)} tokens")

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def labels(self) -> list[int]:
        return [IGNORE_INDEX] * (len(self.prompt_ids) - 1) + self.response_ids + [IGNORE_INDEX]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_actions(self) -> int:
        return len(self.response_ids)


@dataclass
class RLMicroBatch:
    """Packed trajectories and the per-sequence / per-action-token tensors the losses need.

    Attributes:
        row: the packed ``input_ids``, ``positions``, ``cu_seqlens``, ``max_seqlen`` and the host
            bounds ``cu_seqlens_host`` (kept on the host when the row moves to a device).
        action_labels: [A] int64, the sampled token of every action position, in packed order.
        rewards: [n] fp32, the judger's +1 / -1 (a reward_fn's own rewards if set; correct = > 0).
        advantages: [n] fp32.
        action_index: [A] int64, packed position of every action token (A = sum R_i), in order.
        action_seq: [A] int64, the local sequence index of every action token.
        action_cu_seqlens: [n + 1] int64, sequence boundaries within the A action tokens.
        rollout_logprobs: [A] fp32, the rollout engine's log-prob of every action token; None
            unless every trajectory has them.
    """

    row: PackedRow
    action_labels: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    action_index: torch.Tensor
    action_seq: torch.Tensor
    action_cu_seqlens: torch.Tensor
    rollout_logprobs: torch.Tensor | None = None

    def to(self, device: torch.device) -> "RLMicroBatch":
        """The same micro-batch on ``device``, moved in two copies (one int64 buffer, one fp32)."""
        return _move_all([self], device)[0]


def make_micro_batch(trajectories: list[Trajectory]) -> RLMicroBatch:
    """Packs trajectories (each with at least one response token) into one micro-batch (host tensors)."""
    lens = torch.tensor([t.num_actions for t in trajectories], dtype=torch.int64)
    labels = torch.tensor([x for t in trajectories for x in t.labels], dtype=torch.int64)
    action_index = torch.nonzero(labels != IGNORE_INDEX).squeeze(1)  # on the host: no device sync on a mask
    engine_lps = [t.rollout_logprobs for t in trajectories]
    return RLMicroBatch(
        row=pack_sequences([t.input_ids for t in trajectories]),
        action_labels=labels[action_index],
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        advantages=torch.tensor([t.advantage for t in trajectories], dtype=torch.float32),
        action_index=action_index,
        action_seq=torch.repeat_interleave(torch.arange(len(trajectories)), lens),
        action_cu_seqlens=torch.nn.functional.pad(torch.cumsum(lens, 0), (1, 0)),
        rollout_logprobs=None if any(lp is None for lp in engine_lps) else torch.cat(engine_lps).float(),
    )


def plan_micro_batches(num_tokens: list[int], micro_batch_size: int, token_budget: int) -> list[range]:
    """Consecutive groups of trajectory indices, in kept order (4.8).

    Args:
        num_tokens: prompt + response length of each kept trajectory.
        micro_batch_size: trajectories per micro-batch when ``token_budget`` is 0 (the official
            split; the last group may be smaller).
        token_budget: > 0 packs trajectories while the group's total stays <= the budget; a
            trajectory longer than the budget forms a group of its own.

    Returns:
        Index ranges covering 0 .. len(num_tokens) - 1 once each, in order.
    """
    n = len(num_tokens)
    if token_budget <= 0:
        return [range(i, min(i + micro_batch_size, n)) for i in range(0, n, micro_batch_size)]
    groups, start, total = [], 0, 0
    for i, length in enumerate(num_tokens):
        if i > start and total + length > token_budget:
            groups.append(range(start, i))
            start, total = i, 0
        total += length
    if n:
        groups.append(range(start, n))
    return groups


def make_micro_batches(trajectories: list[Trajectory], groups: list[range], device: torch.device
                       ) -> list[RLMicroBatch]:
    """The micro-batches of ``groups`` (a ``plan_micro_batches`` plan of ``trajectories``) on
    ``device``, moved in two copies in all; none for no groups (a data-parallel rank whose share is empty)."""
    if not groups:
        return []
    return _move_all([make_micro_batch([trajectories[i] for i in g]) for g in groups], device)


def iter_micro_batches(trajectories: list[Trajectory], groups: list[range], device: torch.device
                       ) -> Iterator[RLMicroBatch]:
    """The micro-batches of ``make_micro_batches``, each packed on the host and sent to ``device``
    (pinned, non-blocking) only when the caller asks for it: a loop that queues one micro-batch's
    GPU work before asking for the next packs the next while the GPU runs the current one, and the
    first starts without waiting for the others to be packed."""
    for g in groups:
        yield make_micro_batch([trajectories[i] for i in g]).to(device)


_INT_FIELDS = ("action_labels", "action_index", "action_seq", "action_cu_seqlens")


def _float_fields(batch: RLMicroBatch) -> list[torch.Tensor]:
    rollout = [] if batch.rollout_logprobs is None else [batch.rollout_logprobs]
    return [batch.rewards, batch.advantages, *rollout]


def _move_all(batches: list[RLMicroBatch], device: torch.device) -> list[RLMicroBatch]:
    """Moves every tensor of ``batches`` with one int64 and one fp32 host-to-device copy.

    Each small tensor copied on its own costs a synchronous transfer; concatenated into one pinned
    buffer, the copies overlap with the GPU work already queued.
    """
    ints = [t for b in batches for t in (b.row.input_ids, b.row.positions, b.row.cu_seqlens.long(),
                                         *(getattr(b, f) for f in _INT_FIELDS))]
    floats = [t for b in batches for t in _float_fields(b)]
    pin = device.type == "cuda"
    int_parts = iter(_copy_concat(ints, device, pin).split([t.numel() for t in ints]))
    float_parts = iter(_copy_concat(floats, device, pin).split([t.numel() for t in floats]))
    moved = []
    for b in batches:
        ids, positions, cu, *rest = (next(int_parts) for _ in range(3 + len(_INT_FIELDS)))
        row = PackedRow(ids, positions, cu.to(torch.int32), b.row.cu_seqlens_host)
        rewards, advantages = next(float_parts), next(float_parts)
        rollout = None if b.rollout_logprobs is None else next(float_parts)
        moved.append(RLMicroBatch(row, rest[0], rewards, advantages, *rest[1:], rollout_logprobs=rollout))
    return moved


def _copy_concat(tensors: list[torch.Tensor], device: torch.device, pin: bool) -> torch.Tensor:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if pin:
        flat = flat.pin_memory()
    return flat.to(device, non_blocking=pin)
