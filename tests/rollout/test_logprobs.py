"""Each generated token's log-prob from the plain sampler and the paged engine (fp32, tiny model)
against a direct teacher-forced forward's fp64 log_softmax at that token: temperature 1, before
top-k and top-p, whatever the sampling settings. Sampled runs at temperature 0.7 and 1.3 would
fail if an engine returned the tempered or the filtered distribution's log-probs."""

import os

import pytest
import torch
import torch.nn.functional as F

from oreal_fast.rollout import PlainSampler, SamplingParams

from test_engine import BASE, PROMPTS, engine, greedy

SETTINGS = {
    "greedy": greedy(12),
    "top_p": SamplingParams(max_new_tokens=12, max_length=64, top_p=0.9, temperature=0.7),
    "top_k": SamplingParams(max_new_tokens=12, max_length=64, top_k=5, temperature=1.3),
}
ATOL = 2e-5  # fp32 forwards (KV cache against one packed pass) against fp64 log_softmax


def direct_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log_softmax of the fp32 logits (in fp64) at each response token, teacher-forced: [R] fp64."""
    ids = torch.tensor(prompt + response)
    P, T = len(prompt), len(ids)
    with torch.no_grad():
        logits = model(ids, torch.arange(T), torch.tensor([0, T], dtype=torch.int32), T,
                       head=lambda h, w: F.linear(h[P - 1 : T - 1], w))  # (R, V)
    return torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def assert_direct_logprobs(model, prompts, responses, logprobs) -> None:
    assert len(logprobs) == len(responses) == len(prompts)
    for i, (prompt, response, lp) in enumerate(zip(prompts, responses, logprobs)):
        assert lp.dtype == torch.float32 and lp.shape == (len(response),) and lp.device.type == "cpu", i
        torch.testing.assert_close(lp.double(), direct_logprobs(model, prompt, response), atol=ATOL, rtol=0,
                                   msg=f"response {i}")
        assert (lp < 0).all()


@pytest.mark.parametrize("name", SETTINGS)
def test_plain_sampler_logprobs_equal_a_direct_forward(models, name):
    _, ours = models
    sampler = PlainSampler(ours, max_batch_size=3)  # three batches: the lists come back in prompt order
    got = sampler.generate(PROMPTS, SETTINGS[name], torch.Generator().manual_seed(1))
    assert_direct_logprobs(ours, PROMPTS, got, sampler.response_logprobs())


@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("blocks, steps_per_round, static_shapes", [(400, 1, False), (400, 5, True), (18, 4, False)],
                         ids=["one_step", "rounds_graph_shapes", "tiny_pool_preempts"])
def test_paged_engine_logprobs_equal_a_direct_forward(models, name, blocks, steps_per_round, static_shapes):
    """First tokens from the prefill, the rest from decode rounds; a preempted sequence keeps the
    log-probs its tokens were sampled with when it is recomputed."""
    _, ours = models
    e = engine(ours, blocks=blocks, decode_steps_per_round=steps_per_round, max_num_seqs=16)
    e.runner.static_shapes = static_shapes
    caps = [12, 4, 12, 12, 1, 12, 7, 12, 12]
    got = e.generate(PROMPTS, SETTINGS[name], torch.Generator().manual_seed(2), max_new_per_prompt=caps)
    assert [len(r) for r in got] == caps
    assert (e.stats()["preemptions"] > 0) == (blocks == 18)
    assert_direct_logprobs(ours, PROMPTS, got, e.response_logprobs())


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton sampler on CPU needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("name", ["greedy", "top_p"])
def test_paged_engine_logprobs_through_the_triton_sampler(models, name):
    """The engine's CUDA path on CPU: the sampler kernel's fused log-sum-exp (sampled) and
    `token_logprobs` (greedy), from the prefill and from decode rounds."""
    _, ours = models
    e = engine(ours, decode_steps_per_round=3)
    e.runner.sample_impl = "triton"
    params = SamplingParams(**{**SETTINGS[name].__dict__, "max_new_tokens": 5})
    got = e.generate(BASE, params, torch.Generator().manual_seed(3))
    assert [len(r) for r in got] == [5] * len(BASE)
    assert_direct_logprobs(ours, BASE, got, e.response_logprobs())
