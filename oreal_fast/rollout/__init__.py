"""Generation: the rollout interface, official next-token sampling and the plain KV-cache sampler."""

from oreal_fast.rollout.base import RolloutEngine, SamplingParams, check_prompts, finished, new_token_limits
from oreal_fast.rollout.plain_sampler import PlainSampler
from oreal_fast.rollout.sampling import filter_logits, sample_next_token

__all__ = [
    "PlainSampler", "RolloutEngine", "SamplingParams", "check_prompts", "filter_logits", "finished",
    "new_token_limits", "sample_next_token",
]
