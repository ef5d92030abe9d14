import math

import pytest
import torch

from oreal_fast.algo import compute_advantages, grpo_advantages, rloo_advantages


def _group(c: int, k: int = 16) -> torch.Tensor:
    return torch.tensor([1.0] * c + [-1.0] * (k - c))


@pytest.mark.parametrize("c", [1, 4, 8, 12, 15])
def test_rloo_matches_table_10_1(c):
    adv = rloo_advantages(_group(c), 16)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv[:c], torch.full((c,), 2 * (16 - c) / 15))
    torch.testing.assert_close(adv[c:], torch.full((16 - c,), -2 * c / 15))


@pytest.mark.parametrize("c", [0, 16])
def test_rloo_uniform_group_is_zero(c):
    assert torch.equal(rloo_advantages(_group(c), 16), torch.zeros(16))


def test_rloo_groups_are_independent():
    rewards = torch.cat([_group(4), _group(12)])
    adv = rloo_advantages(rewards, 16)
    torch.testing.assert_close(adv[:4], torch.full((4,), 1.6))
    torch.testing.assert_close(adv[16 + 12 :], torch.full((4,), -1.6))


def test_grpo_hand_case():
    # group [1, -1, -1, -1]: mean -0.5, unbiased std sqrt(((1.5)^2 + 3 * 0.5^2) / 3) = 1
    adv = grpo_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0]), 4)
    std = math.sqrt((1.5**2 + 3 * 0.5**2) / 3)
    expected = [1.5 / (std + 1e-8)] + [-0.5 / (std + 1e-8)] * 3 + [0.0] * 4
    torch.testing.assert_close(adv, torch.tensor(expected))


@pytest.mark.parametrize("shaping", ["rloo", "grpo"])
def test_dispatch(shaping):
    r = _group(5)
    fn = rloo_advantages if shaping == "rloo" else grpo_advantages
    assert torch.equal(compute_advantages(r, 16, shaping), fn(r, 16))


@pytest.mark.parametrize(
    "rewards,k,shaping",
    [(torch.ones(10), 4, "rloo"), (torch.ones(4), 1, "rloo"), (torch.ones(4), 4, "ppo")],
)
def test_bad_inputs_raise(rewards, k, shaping):
    with pytest.raises(ValueError):
        compute_advantages(rewards, k, shaping)
