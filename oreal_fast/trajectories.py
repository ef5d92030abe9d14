"""Trajectories and RL micro-batches (reference 4.6 and 4.8).

A trajectory is one prompt's token ids plus one sampled response (stop token kept). Its labels are
pre-shifted as the official trainer's: ``[-100] * (P - 1) + response + [-100]``, so the last prompt
position predicts the first response token and the final position predicts nothing. A micro-batch
packs ``rl_mirco_batch`` trajectories, in kept order, into one varlen row.

Invariant: the action tokens of a micro-batch (labels != -100) appear in packed order, so the
per-token tensors of the loss are the concatenation of each trajectory's R response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oreal_fast.data.packing import PackedRow, pack_sequences

IGNORE_INDEX = -100


@dataclass
class Trajectory:
    """One generated sample: prompt + response ids, its reward and RLOO/GRPO advantage."""

    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    advantage: float

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
        row: the packed ``input_ids``, ``positions``, ``cu_seqlens``, ``max_seqlen``.
        labels: [T] int64, -100 off the action tokens.
        rewards: [n] fp32, +1 / -1.
        advantages: [n] fp32.
        action_index: [A] int64, packed position of every action token (A = sum R_i), in order.
        action_seq: [A] int64, the local sequence index of every action token.
        action_cu_seqlens: [n + 1] int64, sequence boundaries within the A action tokens.
    """

    row: PackedRow
    labels: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    action_index: torch.Tensor
    action_seq: torch.Tensor
    action_cu_seqlens: torch.Tensor

    def to(self, device: torch.device) -> "RLMicroBatch":
        row = PackedRow(
            input_ids=self.row.input_ids.to(device),
            positions=self.row.positions.to(device),
            cu_seqlens=self.row.cu_seqlens.to(device),
            max_seqlen=self.row.max_seqlen,
        )
        return RLMicroBatch(
            row=row,
            labels=self.labels.to(device),
            rewards=self.rewards.to(device),
            advantages=self.advantages.to(device),
            action_index=self.action_index.to(device),
            action_seq=self.action_seq.to(device),
            action_cu_seqlens=self.action_cu_seqlens.to(device),
        )


def make_micro_batch(trajectories: list[Trajectory]) -> RLMicroBatch:
    """Packs trajectories (each with at least one response token) into one micro-batch."""
    lens = torch.tensor([t.num_actions for t in trajectories], dtype=torch.int64)
    labels = torch.tensor([x for t in trajectories for x in t.labels], dtype=torch.int64)
    return RLMicroBatch(
        row=pack_sequences([t.input_ids for t in trajectories]),
        labels=labels,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        advantages=torch.tensor([t.advantage for t in trajectories], dtype=torch.float32),
        # built here, on the host, so the device never has to sync on a boolean mask
        action_index=torch.nonzero(labels != IGNORE_INDEX).squeeze(1),
        action_seq=torch.repeat_interleave(torch.arange(len(trajectories)), lens),
        action_cu_seqlens=torch.nn.functional.pad(torch.cumsum(lens, 0), (1, 0)),
    )


def make_micro_batches(trajectories: list[Trajectory], micro_batch_size: int) -> list[RLMicroBatch]:
    """Consecutive groups of ``micro_batch_size`` in kept order; the last may be smaller (4.8)."""
    return [
        make_micro_batch(trajectories[i : i + micro_batch_size])
        for i in range(0, len(trajectories), micro_batch_size)
    ]
