"""The trainer with the paged engine on CPU: built from the config keys, generating a real step,
its weight copy following the actor after the optimiser step, its stats in the step metrics."""

from __future__ import annotations

import pytest
import torch

from oreal_fast.config import ConfigError, load_config
from oreal_fast.rollout import PagedEngine, PlainSampler
from oreal_fast.trainer import Trainer

from trainer_helpers import K, REWARDS, ScriptedRouter, write_config


def test_paged_engine_generates_a_step_and_follows_the_actor(tmp_path, tiny_model_dir, perturbed_actor_dir,
                                                            prompt_file):
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file,
                                   rollout_engine="paged", kv_block_size=8, max_num_seqs=64))
    trainer = Trainer(cfg, router=ScriptedRouter(REWARDS))
    engine = trainer.rollout
    assert isinstance(engine, PagedEngine) and engine.config.block_size == 8
    assert engine.config.max_model_len == cfg.gen_max_length
    assert engine.config.max_num_seqs == cfg.gen_global_batch  # never more rows than a step has samples
    before = {k: v.clone() for k, v in engine.runner.model.decoder_views().items()}
    metrics = trainer.step(0)
    assert metrics["rollout_generated_tokens"] == round(metrics["avg_new_tokens"] * 2 * K)
    assert metrics["rollout_prefix_hit_rate"] == pytest.approx(1 - 1 / K)  # k copies of 2 prompts
    assert metrics["rollout_preemptions"] == 0 and metrics["rollout_decode_steps"] >= 1
    actor = trainer.models.actor.state_dict()
    copy = engine.runner.model.decoder_views()
    assert all(torch.equal(copy[k], actor[k]) for k in copy)  # synced after the actor's AdamW step
    assert not all(torch.equal(copy[k], before[k]) for k in copy)


def test_auto_is_the_plain_sampler_on_cpu_and_a_too_small_pool_is_a_config_error(tmp_path, tiny_model_dir,
                                                                                prompt_file):
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file))
    assert isinstance(Trainer(cfg, router=ScriptedRouter(REWARDS)).rollout, PlainSampler)
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file,
                                   rollout_engine="paged", kv_cache_gib=1e-6))
    with pytest.raises(ConfigError, match="kv_cache_gib in .*less than one sequence of max_model_len = 160"):
        Trainer(cfg, router=ScriptedRouter(REWARDS))


@pytest.mark.parametrize("key, value, why", [
    ("rollout_engine", "vllm", "must be one of auto, paged, plain"),
    ("kv_cache_gib", 0, "finite float > 0"),
    ("kv_cache_memory_fraction", 1.5, r"must be in \(0, 1\]"),
    ("kv_block_size", 0, "int >= 1"),
    ("max_num_seqs", 0, "int >= 1"),
    ("max_prefill_tokens", 0, "int >= 1"),
    ("decode_steps_per_round", 0, "int >= 1"),
    ("overlap_decode_rounds", "yes", "expected bool"),
])
def test_engine_keys_are_range_checked(tmp_path, tiny_model_dir, prompt_file, key, value, why):
    with pytest.raises(ConfigError, match=f"{key} in .*{why}"):
        load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, **{key: value}))
