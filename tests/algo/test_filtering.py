import random

import pytest

from oreal_fast.algo import filter_one_pair, group_pass_rates, keep_all, select_trajectories

K = 4
# groups: mixed (c=1), all correct, mixed (c=3), all wrong, mixed (c=2)
REWARDS = [
    -1.0, 1.0, -1.0, -1.0,
    1.0, 1.0, 1.0, 1.0,
    1.0, -1.0, 1.0, 1.0,
    -1.0, -1.0, -1.0, -1.0,
    -1.0, 1.0, -1.0, 1.0,
]


def _expected(seed: int) -> list[int]:
    # Independent replay: per mixed group choice(correct) then choice(incorrect).
    rng = random.Random(seed)
    picks = []
    picks.append(rng.choice([1]))
    picks.append(rng.choice([0, 2, 3]))
    picks.append(rng.choice([8, 10, 11]))
    picks.append(rng.choice([9]))
    picks.append(rng.choice([17, 19]))
    picks.append(rng.choice([16, 18]))
    return picks


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_filter_replays_random_stream(seed):
    kept = filter_one_pair(REWARDS, K, random.Random(seed))
    assert kept.indices == _expected(seed)


def test_filter_leaves_rng_where_official_does():
    rng = random.Random(7)
    filter_one_pair(REWARDS, K, rng)
    ref = random.Random(7)
    _ = [ref.choice(range(n)) for n in (1, 3, 3, 1, 2, 2)]
    assert rng.random() == ref.random()


def test_filter_all_uniform_is_empty():
    kept = filter_one_pair([1.0] * 4 + [-1.0] * 4, K, random.Random(0))
    assert kept.indices == []


def test_keep_all():
    kept = keep_all(REWARDS, K)
    assert kept.indices == list(range(20))


@pytest.mark.parametrize("flag", [True, False])
def test_select_dispatch(flag):
    got = select_trajectories(REWARDS, K, random.Random(3), flag)
    want = filter_one_pair(REWARDS, K, random.Random(3)) if flag else keep_all(REWARDS, K)
    assert got == want


def test_bad_length_raises():
    with pytest.raises(ValueError, match="multiple of prompt_repeat_k"):
        filter_one_pair([1.0] * 5, K, random.Random(0))


def test_correct_means_a_positive_reward():
    """A reward_fn's float rewards: > 0 is correct (0.4, 2.5), anything else incorrect (0.0, -0.3); on
    +1 / -1 this is the official reward == 1."""
    rewards = [0.4, 0.0, -0.3, 2.5, 0.0, -1.0, -0.5, 0.0, 0.1, 0.2, 0.3, 0.4]  # mixed, all wrong, all correct
    assert group_pass_rates(rewards, K) == [0.5, 0.0, 1.0]
    rng = random.Random(5)
    want = random.Random(5)
    assert filter_one_pair(rewards, K, rng).indices == [want.choice([0, 3]), want.choice([1, 2])]
