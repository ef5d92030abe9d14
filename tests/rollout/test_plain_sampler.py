import pytest
import torch

from oreal_fast.rollout import PlainSampler, SamplingParams

PROMPTS = [[3, 17, 8, 40, 2], [9], [50, 1, 1, 33, 12, 7, 26, 5, 44], [21, 22]]


def greedy(max_new, max_length=64, stop=()):
    return SamplingParams(max_new_tokens=max_new, max_length=max_length, do_sample=False, stop_token_ids=stop)


def hf_greedy(hf, prompt, max_new, stop):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                      eos_token_id=stop, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_matches_transformers_generate_with_stop_token_kept(models):
    hf, ours = models
    free = hf_greedy(hf, PROMPTS[0], 12, None)
    # stop on the 4th token transformers generates for prompt 0 (first time it appears)
    idx = next(i for i in range(3, 12) if free[i] not in free[:i])
    stop = free[idx]
    expected = [hf_greedy(hf, p, 12, stop) for p in PROMPTS]
    got = PlainSampler(ours, max_batch_size=3).generate(PROMPTS, greedy(12, stop=(stop,)), torch.Generator())
    assert got == expected
    assert got[0][-1] == stop and len(got[0]) == idx + 1


def test_max_new_tokens_caps_every_response(models):
    _, ours = models
    got = PlainSampler(ours, max_batch_size=4).generate(PROMPTS, greedy(5), torch.Generator())
    assert [len(r) for r in got] == [5, 5, 5, 5]


def test_max_length_caps_prompt_plus_response(models):
    _, ours = models
    got = PlainSampler(ours, max_batch_size=4).generate(PROMPTS, greedy(50, max_length=10), torch.Generator())
    assert [len(r) for r in got] == [5, 9, 1, 8]


def test_sampled_run_is_reproducible_with_the_same_seed(models):
    _, ours = models
    params = SamplingParams(max_new_tokens=6, max_length=64, top_k=20, top_p=0.9, temperature=0.8)
    a = PlainSampler(ours, max_batch_size=2).generate(PROMPTS, params, torch.Generator().manual_seed(7))
    b = PlainSampler(ours, max_batch_size=2).generate(PROMPTS, params, torch.Generator().manual_seed(7))
    assert a == b and [len(r) for r in a] == [6, 6, 6, 6]


def test_prompt_without_room_is_refused(models):
    _, ours = models
    with pytest.raises(ValueError, match="prompt 2 has 9 tokens"):
        PlainSampler(ours, max_batch_size=4).generate(PROMPTS, greedy(5, max_length=9), torch.Generator())
