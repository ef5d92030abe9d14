"""Packing sequences into one varlen row."""

import pytest
import torch

from oreal_fast.data import pack_sequences


def test_packed_row_positions_restart_and_cu_seqlens_are_int32():
    row = pack_sequences([[5, 6, 7], [8], [9, 10]])
    assert row.input_ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert row.input_ids.dtype == torch.int64
    assert row.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert row.positions.dtype == torch.int64
    assert row.cu_seqlens.tolist() == [0, 3, 4, 6]
    assert row.cu_seqlens.dtype == torch.int32
    assert row.cu_seqlens_host == (0, 3, 4, 6)  # the same bounds as host ints, for the attention backends
    assert row.max_seqlen == 3


@pytest.mark.parametrize("seqs", [[], [[1], []]])
def test_empty_input_is_an_error(seqs):
    with pytest.raises(ValueError):
        pack_sequences(seqs)
