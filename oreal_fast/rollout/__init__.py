"""Generation: the rollout interface, official next-token sampling and the reference KV-cache sampler."""

from oreal_fast.rollout.base import RolloutEngine, SamplingParams
from oreal_fast.rollout.reference_sampler import ReferenceSampler
from oreal_fast.rollout.sampling import filter_logits, sample_next_token

__all__ = ["ReferenceSampler", "RolloutEngine", "SamplingParams", "filter_logits", "sample_next_token"]
