"""Both engines report progress as they generate: the responses finished and the tokens sampled so
far, after every forward (plain sampler) or every prefill chunk and decode round (paged engine),
matching what the responses' lengths say they must be at that point."""

import pytest
import torch

from oreal_fast.progress import Progress
from oreal_fast.rollout import EngineConfig, PagedEngine, PlainSampler, SamplingParams

PROMPTS = [[3, 17, 8, 40, 2], [9], [50, 1, 1, 33, 12, 7, 26, 5, 44], [21, 22]]


def greedy(max_new, max_length=64):
    return SamplingParams(max_new_tokens=max_new, max_length=max_length, do_sample=False)


def recorded(progress: Progress) -> list[tuple[int, int]]:
    seen = []
    progress.subscribe(lambda c: seen.append((c.done, c.tokens)))
    return seen


def after_each_token(lengths: list[int]) -> list[tuple[int, int]]:
    """(responses done, tokens sampled) after the j-th token of every running response, j = 1, 2, ...,
    when all responses decode together: a response of length L is done from its L-th token on."""
    return [(sum(n <= j for n in lengths), sum(min(n, j) for n in lengths)) for j in range(1, max(lengths) + 1)]


def test_plain_sampler_reports_after_every_forward(models):
    _, ours = models
    progress = Progress()
    seen = recorded(progress)
    # max_length 10 gives lengths 5, 9, 1, 8 (prompts of 5, 1, 9 and 2 tokens)
    out = PlainSampler(ours, max_batch_size=4, progress=progress).generate(PROMPTS, greedy(50, 10), torch.Generator())
    lengths = [len(r) for r in out]
    assert lengths == [5, 9, 1, 8]
    assert seen == after_each_token(lengths)


def test_plain_sampler_counts_run_on_over_its_batches(models):
    _, ours = models
    progress = Progress()
    seen = recorded(progress)
    PlainSampler(ours, max_batch_size=2, progress=progress).generate(PROMPTS, greedy(50, 10), torch.Generator())
    first = after_each_token([5, 9])
    assert seen == first + [(first[-1][0] + d, first[-1][1] + t) for d, t in after_each_token([1, 8])]


@pytest.mark.parametrize("steps_per_round", [1, 3])
def test_paged_engine_reports_at_each_prefill_and_round(models, steps_per_round):
    _, ours = models
    c = ours.config
    block_bytes = 2 * c.num_layers * 4 * c.num_kv_heads * c.head_dim * 4
    cfg = EngineConfig(max_model_len=64, kv_cache_bytes=400 * block_bytes, block_size=4,
                       decode_steps_per_round=steps_per_round)
    progress = Progress()
    seen = recorded(progress)
    caps = [6, 2, 11, 1]
    out = PagedEngine(ours, cfg, progress=progress).generate(PROMPTS, greedy(20), torch.Generator(),
                                                             max_new_per_prompt=caps)
    assert [len(r) for r in out] == caps
    # one prefill chunk gives every first token; then each round adds steps_per_round tokens per running row
    every_token = after_each_token(caps)
    assert seen == every_token[:1] + every_token[steps_per_round::steps_per_round] + (
        every_token[-1:] if (len(every_token) - 1) % steps_per_round else [])
