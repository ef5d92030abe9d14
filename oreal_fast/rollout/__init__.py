"""Generation: the rollout interface, official next-token sampling, the plain KV-cache sampler,
the paged engine, and `build_rollout`, which picks and sizes one."""

from oreal_fast.rollout.base import RolloutEngine, SamplingParams, check_prompts, finished, new_token_limits
from oreal_fast.rollout.build import build_rollout, sampling_params
from oreal_fast.rollout.engine import EngineConfig, PagedEngine, kv_cache_bytes
from oreal_fast.rollout.plain_sampler import PlainSampler
from oreal_fast.rollout.sampling import filter_logits, sample_next_token

__all__ = [
    "EngineConfig", "PagedEngine", "PlainSampler", "RolloutEngine", "SamplingParams", "build_rollout", "check_prompts",
    "filter_logits", "finished", "kv_cache_bytes", "new_token_limits", "sample_next_token", "sampling_params",
]
