"""`build_rollout`: the engine a config names, its sizes, and how each engine takes new weights."""

import pytest
import torch

from oreal_fast.config import ConfigError, config_from_values
from oreal_fast.model.decoder import Decoder
from oreal_fast.parallel import full_weights
from oreal_fast.rollout import PagedEngine, PlainSampler, SamplingParams, build_rollout, sampling_params


@pytest.fixture
def ours(models):
    return models[1]


def _cfg(**values):
    base = {"actor": "unused", "datasets": "package://oreal_fast/assets/demo_problems.jsonl", "gen_max_new": 6, "gen_max_length": 32,
            "gen_top_p": 0.7, "gen_top_k": 5, "temperature": 0.9,
            "judgers_config": {"math_judger": {"hosts": [], "rule_only": True, "stop_word": "<|im_end|>"}}}
    return config_from_values({**base, **values}, "test")


def _perturbed(model: Decoder, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: t + 0.01 * torch.randn(t.shape, generator=g) for n, t in model.state_dict().items()}


def test_sampling_params_follow_the_config():
    params = sampling_params(_cfg(gen_do_sample=False), stop_token_id=7)
    assert params == SamplingParams(max_new_tokens=6, max_length=32, top_k=5, top_p=0.7, temperature=0.9,
                                    do_sample=False, stop_token_ids=(7,))


@pytest.mark.parametrize("name, kind", [("auto", PlainSampler), ("plain", PlainSampler), ("paged", PagedEngine)])
def test_engine_choice_on_cpu(ours, name, kind):
    cfg = _cfg(rollout_engine=name, kv_cache_gib=0.001, kv_block_size=4, decode_steps_per_round=3,
               overlap_decode_rounds=False)
    rollout = build_rollout(cfg, ours, compute_dtype=torch.float32, num_sessions=6)
    assert type(rollout) is kind
    if kind is PlainSampler:
        assert rollout.max_batch_size == 6  # every session at once on CPU
    else:
        assert rollout.config.max_num_seqs == 6 and rollout.config.block_size == 4
        assert rollout.config.decode_steps_per_round == 3 and rollout.config.overlap_rounds is False


def test_pool_too_small_names_its_key(ours):
    cfg = _cfg(rollout_engine="paged", kv_cache_gib=1e-7)
    with pytest.raises(ConfigError, match="kv_cache_gib"):
        build_rollout(cfg, ours, compute_dtype=torch.float32, num_sessions=4)


@pytest.mark.parametrize("data_parallel", [False, True])
def test_plain_sampler_weights(ours, data_parallel):
    rollout = build_rollout(_cfg(), ours, compute_dtype=torch.float32, num_sessions=4, data_parallel=data_parallel)
    assert (rollout.model is ours) != data_parallel  # a whole copy only under data parallelism
    new = _perturbed(ours, seed=3)
    rollout.sync_weights(iter(new.items()))
    for name, t in rollout.model.state_dict().items():
        expected = new[name] if data_parallel else ours.state_dict()[name]
        torch.testing.assert_close(t, expected, rtol=0, atol=0)


def test_paged_engine_takes_new_weights(ours):
    engine = build_rollout(_cfg(rollout_engine="paged", kv_cache_gib=0.001), ours, compute_dtype=torch.float32,
                           num_sessions=4)
    new = _perturbed(ours, seed=4)
    engine.sync_weights(iter(new.items()))
    for name, t in engine.runner.model.decoder_views().items():
        torch.testing.assert_close(t, new[name], rtol=0, atol=0)
    with pytest.raises(KeyError, match="not given"):
        engine.sync_weights(list(new.items())[1:])


def test_full_weights_of_a_plain_model_are_its_tensors(ours):
    assert [n for n, _ in full_weights(ours)] == list(ours.state_dict())
