"""The paged engine out of GPU memory: a prefill that runs out is split and retried, a pool that cannot
be allocated is retried smaller; greedy responses stay those of a run with room, every block comes
back, and what cannot be recovered raises. Out-of-memory errors are injected where the CUDA allocator
would raise them (the prefill forward, the pool's allocation)."""

import logging

import pytest
import torch

from oreal_fast.rollout import EngineConfig, PagedEngine, PlainSampler, SamplingParams
from oreal_fast.rollout.engine.model_runner import ModelRunner

PROMPTS = [[3, 17, 8, 40, 2]] * 2 + [[9]] + [[50, 1, 1, 33, 12, 7, 26, 5, 44]] * 3 + [[21, 22], [5, 6, 7]]
GREEDY = SamplingParams(max_new_tokens=12, max_length=32, do_sample=False)


def oom(what: str) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {what}")


def make_engine(model, blocks: int = 200, **kw) -> PagedEngine:
    c = model.config
    block_bytes = 2 * c.num_layers * 4 * c.num_kv_heads * c.head_dim * 4
    cfg = EngineConfig(max_model_len=32, kv_cache_bytes=blocks * block_bytes, block_size=4, **kw)
    return PagedEngine(model, cfg)


@pytest.fixture
def expected(models):
    return PlainSampler(models[1], max_batch_size=16).generate(PROMPTS, GREEDY, torch.Generator())


def test_prefill_out_of_memory_is_split_and_gives_the_same_tokens(models, expected, monkeypatch, caplog):
    e = make_engine(models[1], max_prefill_batch=8)
    prefill, sizes = e.runner.prefill, []

    def prefill_under_a_cap(specs, sample_rows):  # the forward of more than 10 tokens runs out
        tokens = sum(len(prompt) + n for prompt, _, n, _ in specs)
        sizes.append(tokens)
        if tokens > 10:
            raise oom("1.00 GiB")
        return prefill(specs, sample_rows)

    monkeypatch.setattr(e.runner, "prefill", prefill_under_a_cap)
    with caplog.at_level(logging.WARNING):
        assert e.generate(PROMPTS, GREEDY, torch.Generator()) == expected
    stats = e.stats()
    assert stats["prefill_oom_splits"] > 0 and stats["pool_oom_shrinks"] == 0
    assert sizes[0] > 10  # the first chunk ran out ...
    assert e.scheduler.max_prefill_tokens <= sizes[0] // 2  # ... and later chunks are smaller
    assert e.blocks.num_used == 0
    assert "out of GPU memory in a prefill" in caplog.text
    # the counts are per call: a call with room counts none
    monkeypatch.setattr(e.runner, "prefill", prefill)
    assert e.generate(PROMPTS, GREEDY, torch.Generator()) == expected
    assert e.stats()["prefill_oom_splits"] == 0


def test_a_single_prompt_that_runs_out_raises(models, monkeypatch):
    e = make_engine(models[1])

    def always_out(specs, sample_rows):
        raise oom("4.00 GiB")

    monkeypatch.setattr(e.runner, "prefill", always_out)
    with pytest.raises(torch.OutOfMemoryError, match="4.00 GiB"):
        e.generate(PROMPTS, GREEDY, torch.Generator())


def test_pool_out_of_memory_is_retried_smaller(models, expected, monkeypatch, caplog):
    allocate = ModelRunner.allocate

    def allocate_under_a_cap(runner):  # a pool of more than 40 blocks does not fit
        if runner.num_blocks > 41:
            raise oom("64.00 MiB")
        allocate(runner)

    monkeypatch.setattr(ModelRunner, "allocate", allocate_under_a_cap)
    with caplog.at_level(logging.WARNING):
        e = make_engine(models[1], blocks=200)
    assert e.blocks.capacity == 25  # 200 -> 100 -> 50 -> 25 blocks
    assert e.runner.allocated and "retrying with" in caplog.text
    assert e.generate(PROMPTS, GREEDY, torch.Generator()) == expected
    assert e.stats()["pool_oom_shrinks"] == 3 and e.blocks.num_used == 0
    # a resize to a pool that does not fit comes back at half, between calls
    e.resize_pool(80 * e.block_bytes)
    assert e.blocks.capacity == 40
    assert e.generate(PROMPTS, GREEDY, torch.Generator()) == expected
    assert e.stats()["pool_oom_shrinks"] == 1


def test_pool_out_of_memory_at_the_smallest_pool_raises(models, monkeypatch):
    def never_fits(runner):
        raise oom("64.00 MiB")

    monkeypatch.setattr(ModelRunner, "allocate", never_fits)
    with pytest.raises(torch.OutOfMemoryError):
        make_engine(models[1], blocks=200)
