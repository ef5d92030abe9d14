"""Packing several token sequences into one row for varlen attention.

A packed row has no padding and no batch dimension: sequence i occupies
``input_ids[cu_seqlens[i]:cu_seqlens[i+1]]`` and its position ids restart at 0.

Invariant: ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] == len(input_ids)``, every sequence non-empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch


@dataclass
class PackedRow:
    """Sequences concatenated into one row.

    Attributes:
        input_ids: [T] int64, the tokens of all sequences.
        positions: [T] int64, 0..len_i-1 within each sequence.
        cu_seqlens: [N+1] int32, start offsets plus the total length.
        cu_seqlens_host: ``cu_seqlens`` as host ints, for the attention backends that split the row
            per sequence (``Decoder.forward``'s ``cu_seqlens_host``): known when the row is packed, so
            they need not be read back from the device.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_host: tuple[int, ...]

    @property
    def max_seqlen(self) -> int:
        """The longest sequence's length (host int, from the host bounds)."""
        bounds = self.cu_seqlens_host
        return max(end - start for start, end in zip(bounds[:-1], bounds[1:]))


def pack_sequences(seqs: list[list[int]]) -> PackedRow:
    """Concatenates ``seqs`` into a :class:`PackedRow`; raises ValueError on an empty input."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("pack_sequences needs at least one sequence and no empty sequence")
    lens = [len(s) for s in seqs]
    cu_seqlens_host = tuple(accumulate(lens, initial=0))
    lengths = torch.tensor(lens, dtype=torch.int64)
    input_ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int64)
    starts = torch.cumsum(lengths, 0) - lengths  # (N,) offset of each sequence
    positions = torch.arange(len(input_ids)) - torch.repeat_interleave(starts, lengths)
    cu_seqlens = torch.tensor(cu_seqlens_host, dtype=torch.int32)
    return PackedRow(input_ids, positions, cu_seqlens, cu_seqlens_host)
