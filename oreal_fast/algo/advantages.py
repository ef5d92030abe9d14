"""Outcome-reward shaping: per-sample advantages from judger rewards (reference 4.4).

Rewards arrive in prompt-major order, ``k`` contiguous samples per prompt (``repeat_k``), and
each sample is compared only with the other samples of its own group. Everything is computed
in fp32 on the full groups, before the filter drops samples; the kept samples keep these values.
Invariant: the output has the shape and order of the input.
"""

import torch

# Added to the group std so that an all-equal group gives 0 instead of 0/0 (reference 4.4).
GRPO_STD_EPS = 1e-8


def _groups(rewards: torch.Tensor, k: int, min_k: int) -> torch.Tensor:
    if k < min_k:
        raise ValueError(f"prompt_repeat_k must be >= {min_k} for this reward shaping, got {k}")
    if rewards.dim() != 1 or rewards.numel() % k != 0:
        raise ValueError(
            f"rewards must be 1-D with a multiple of prompt_repeat_k={k} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    return rewards.float().view(-1, k)


def rloo_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Leave-one-out baseline: ``A_i = r_i - (sum_g r - r_i) / (k - 1)``.

    With rewards in {+1, -1} and ``c`` correct samples of ``k``, a correct sample gets
    ``2(k - c)/(k - 1)`` and an incorrect one ``-2c/(k - 1)``; uniform groups get 0.

    Args:
        rewards: ``[N]`` float, N a multiple of ``k``, groups contiguous.
        k: samples per prompt (>= 2).

    Returns:
        ``[N]`` fp32 advantages.
    """
    r = _groups(rewards, k, min_k=2)
    return (r - (r.sum(dim=1, keepdim=True) - r) / (k - 1)).reshape(-1)


def grpo_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Group-normalised reward: ``A_i = (r_i - mean_g r) / (std_g r + GRPO_STD_EPS)``.

    The std is the unbiased one (divides by ``k - 1``), as the official trainer's ``torch.std``.

    Args:
        rewards: ``[N]`` float, N a multiple of ``k``, groups contiguous.
        k: samples per prompt (>= 2).

    Returns:
        ``[N]`` fp32 advantages.
    """
    r = _groups(rewards, k, min_k=2)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True, unbiased=True)
    return ((r - mean) / (std + GRPO_STD_EPS)).reshape(-1)


def compute_advantages(rewards: torch.Tensor, k: int, reward_shaping_type: str) -> torch.Tensor:
    """Dispatch on the config's ``reward_shaping_type`` (``"rloo"`` or ``"grpo"``).

    Returns:
        ``[N]`` fp32 advantages.
    """
    if reward_shaping_type == "rloo":
        return rloo_advantages(rewards, k)
    if reward_shaping_type == "grpo":
        return grpo_advantages(rewards, k)
    raise ValueError(f"reward_shaping_type must be 'rloo' or 'grpo', got {reward_shaping_type!r}")
