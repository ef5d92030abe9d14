"""The official prompt order: mmengine-derived shuffle seed, torch.randperm, cyclic batches (reference 3.4, 3.5)."""

import numpy as np
import pytest
import torch

from oreal_fast.data import PromptSampler, repeat_k, shuffle_seed_for


def test_shuffle_seed_for_seed_0_is_the_official_value():
    state = np.random.get_state()
    try:
        np.random.seed(0)  # what mmengine's set_random_seed(0) does to numpy
        drawn = np.random.randint(2**31)  # what sync_random_seed draws next
    finally:
        np.random.set_state(state)
    assert drawn == 209652396
    assert shuffle_seed_for(0) == 209652396


def test_first_batch_is_the_head_of_an_independent_randperm():
    sampler = PromptSampler(num_records=150, prompts_per_step=64, seed=0)
    expected = torch.randperm(150, generator=torch.Generator().manual_seed(209652396))
    assert sampler.shuffle_seed == 209652396
    assert torch.equal(sampler.permutation, expected)
    assert sampler.batch(0) == expected[:64].tolist()
    assert sampler.batch(1) == expected[64:128].tolist()


def test_last_batch_wraps_around_cyclically():
    sampler = PromptSampler(num_records=150, prompts_per_step=64, seed=0)
    perm = sampler.permutation.tolist()
    assert sampler.num_steps == 3  # ceil(150 / 64)
    assert sampler.batch(2) == perm[128:150] + perm[:42]


def test_fewer_records_than_a_batch_repeats_the_permutation():
    sampler = PromptSampler(num_records=5, prompts_per_step=8, seed=3)
    perm = sampler.permutation.tolist()
    assert sampler.num_steps == 1
    assert sampler.batch(0) == perm + perm[:3]


@pytest.mark.parametrize("n, p", [(64, 64), (100, 7), (1000, 64)])
def test_batches_cover_every_record(n, p):
    sampler = PromptSampler(n, p, seed=0)
    seen = [i for b in range(sampler.num_steps) for i in sampler.batch(b)]
    assert len(seen) == sampler.num_steps * p
    assert set(seen) == set(range(n))


def test_step_outside_the_schedule_is_an_error():
    with pytest.raises(IndexError):
        PromptSampler(10, 4, seed=0).batch(3)


def test_state_dict_round_trips_and_detects_a_different_order():
    a = PromptSampler(100, 8, seed=0)
    PromptSampler(100, 8, seed=0).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="num_records"):
        PromptSampler(101, 8, seed=0).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="seed"):
        PromptSampler(100, 8, seed=1).load_state_dict(a.state_dict())


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="no prompt records"):
        PromptSampler(0, 8, seed=0)


@pytest.mark.parametrize("k", [1, 3])
def test_repeat_k_keeps_groups_contiguous(k):
    assert repeat_k(["a", "b"], k) == ["a"] * k + ["b"] * k
