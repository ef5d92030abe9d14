import pytest
import torch

from oreal_fast.rollout import SamplingParams, filter_logits, sample_next_token

PROBS = [0.5, 0.25, 0.15, 0.1]
LOGITS = torch.tensor([PROBS]).log()
INF = float("-inf")


def params(**kw):
    return SamplingParams(max_new_tokens=4, max_length=16, **kw)


def kept(logits):
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


@pytest.mark.parametrize(
    "kw, expected",
    [
        # top-k 2: the two largest
        ({"top_k": 2}, [0, 1]),
        # top-p 0.7: ascending cumsum 0.10, 0.25, 0.50, 1.0; drop <= 0.3 -> drop 0.10 and 0.15
        ({"top_p": 0.7}, [0, 1]),
        # top-p 0.8: drop cumsum <= 0.2 -> only the 0.10 token
        ({"top_p": 0.8}, [0, 1, 2]),
        # top-k 3 first renormalises to 0.556, 0.278, 0.167; then top-p 0.8 drops 0.167 (<= 0.2)
        ({"top_k": 3, "top_p": 0.8}, [0, 1]),
        # top-p 0.01 would drop everything: the largest is never dropped
        ({"top_p": 0.01}, [0]),
        ({"top_k": 10}, [0, 1, 2, 3]),
    ],
)
def test_filter_keeps_hand_worked_sets(kw, expected):
    out = filter_logits(LOGITS, params(**kw))
    assert kept(out) == expected
    assert torch.equal(out[0, expected], LOGITS[0, expected])


def test_temperature_divides_before_top_p():
    # temperature 2 flattens 0.5/0.25/0.15/0.1 to sqrt-proportional probs 0.329/0.233/0.180/0.147 (sum of
    # sqrt = 2.151); ascending cumsum 0.147, 0.327, ...; top-p 0.7 drops cumsum <= 0.3: token 3 alone
    out = filter_logits(LOGITS, params(temperature=2.0, top_p=0.7))
    assert kept(out) == [0, 1, 2]
    assert torch.allclose(out[0, :3], LOGITS[0, :3] / 2)


def test_greedy_is_argmax_and_ignores_top_k():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    assert sample_next_token(logits, params(do_sample=False, top_k=1), g).tolist() == [1, 0]


def test_sampling_frequencies_follow_filtered_distribution():
    g = torch.Generator().manual_seed(0)
    draws = sample_next_token(LOGITS.expand(20000, 4), params(top_k=3), g)
    freq = torch.bincount(draws, minlength=4).float() / 20000
    expected = torch.tensor([0.5, 0.25, 0.15, 0.0]) / 0.9
    assert (freq - expected).abs().max() < 0.015


def test_same_seed_same_tokens():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    a = sample_next_token(logits, params(), torch.Generator().manual_seed(3))
    b = sample_next_token(logits, params(), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "field, value", [("max_new_tokens", 0), ("max_length", 1), ("top_k", -1), ("top_p", 0.0), ("temperature", 0.0)]
)
def test_bad_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{"max_new_tokens": 4, "max_length": 16, field: value})
