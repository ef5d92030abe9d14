import torch

from oreal_fast.algo import global_normalisers, segment_ids


def test_worked_counts():
    lens = torch.tensor([1000, 3000, 7, 12, 5])
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0])
    n = global_normalisers(lens, rewards)
    assert n.num_action.item() == 1000 + 3000 + 7 + 12 + 5
    assert n.num_positive.item() == 1000 + 7
    assert n.num_negative.item() == 3000 + 12 + 5
    assert n.num_seqs.item() == 5


def test_empty_kept_set_counts_zero():
    n = global_normalisers(torch.zeros(0, dtype=torch.long), torch.zeros(0))
    assert [t.item() for t in n] == [0, 0, 0, 0]


def test_segment_ids():
    cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    assert segment_ids(cu, 6).tolist() == [0, 0, 1, 2, 2, 2]
