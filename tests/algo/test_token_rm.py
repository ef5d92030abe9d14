import math

import pytest
import torch

from oreal_fast.algo import (
    cumulative_means,
    rm_bce_loss,
    rm_token_weights,
    sequence_means,
    threshold_weights,
    topk_weights,
)

CU = torch.tensor([0, 3, 5], dtype=torch.int32)
SCORES = [1.0, 3.0, -2.0, 4.0, 0.0]


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cumulative_means_restart_per_sequence(dtype):
    c = cumulative_means(torch.tensor(SCORES, dtype=dtype), CU)
    assert c.dtype == torch.float32 and not c.requires_grad
    torch.testing.assert_close(c, torch.tensor([1.0, 2.0, 2.0 / 3.0, 4.0, 2.0]))


def test_sequence_means_value_and_grad():
    s = torch.tensor(SCORES, requires_grad=True)
    m = sequence_means(s, CU)
    torch.testing.assert_close(m, torch.tensor([2.0 / 3.0, 2.0]))
    (m * torch.tensor([1.0, 10.0])).sum().backward()
    torch.testing.assert_close(s.grad, torch.tensor([1 / 3, 1 / 3, 1 / 3, 10 / 2, 10 / 2]))


def test_rm_bce_hand_formula():
    m = torch.tensor([0.4, -1.2, 0.0])
    rewards = torch.tensor([1.0, -1.0, -1.0])
    # y = int(max(r, 0)): 1, 0, 0; global M = 5 (other micro-batches hold the rest)
    want = (-math.log(_sigmoid(0.4)) - math.log(1 - _sigmoid(-1.2)) - math.log(0.5)) / 5
    got = rm_bce_loss(m, rewards, torch.tensor(5))
    assert got.item() == pytest.approx(want, rel=1e-6)


def test_rm_target_is_one_for_a_positive_reward():
    """A reward_fn's floats: y = 1 iff r > 0 (0.3 and 2.0 correct; 0.0 and -0.5 not); on +1 / -1 the
    official int(max(r, 0))."""
    m = torch.tensor([0.7, -0.2, 1.5, 0.0])
    rewards = torch.tensor([0.3, 0.0, -0.5, 2.0])
    want = (-math.log(_sigmoid(0.7)) - math.log(1 - _sigmoid(-0.2)) - math.log(1 - _sigmoid(1.5))
            - math.log(0.5)) / 4
    assert rm_bce_loss(m, rewards, torch.tensor(4)).item() == pytest.approx(want, rel=1e-6)


def test_zero_head_gives_log2_and_zero_weights():
    s = torch.zeros(5)
    loss = rm_bce_loss(sequence_means(s, CU), torch.tensor([1.0, -1.0]), torch.tensor(2))
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    w_pos, w_neg = threshold_weights(cumulative_means(s, CU), 0.5, 0.5)
    assert torch.equal(w_pos, torch.zeros(5)) and torch.equal(w_neg, torch.zeros(5))


def test_threshold_half_is_exclusive_tanh():
    c = torch.tensor([2.0, -1.0, 0.0, 0.3])
    w_pos, w_neg = threshold_weights(c, 0.5, 0.5)
    want_pos = [max(0.0, math.tanh(x / 2)) for x in c.tolist()]
    want_neg = [max(0.0, -math.tanh(x / 2)) for x in c.tolist()]
    torch.testing.assert_close(w_pos, torch.tensor(want_pos))
    torch.testing.assert_close(w_neg, torch.tensor(want_neg))


def test_threshold_other_taus():
    c = torch.tensor([_logit(0.9), _logit(0.85), _logit(0.1), _logit(0.5)])
    w_pos, w_neg = threshold_weights(c, 0.8, 0.6)
    # w+ = clamp((p - 0.8)/0.2), w- = clamp(((1-p) - 0.6)/0.4)
    torch.testing.assert_close(w_pos, torch.tensor([0.5, 0.25, 0.0, 0.0]))
    torch.testing.assert_close(w_neg, torch.tensor([0.0, 0.0, 0.75, 0.0]))


def test_topk_min_max_per_sequence():
    p = [0.9, 0.2, 0.6, 0.7, 0.1] + [0.3] + [0.4, 0.4, 0.4]
    cu = torch.tensor([0, 5, 6, 9])
    c = torch.tensor([_logit(x) for x in p])
    w_pos, w_neg = topk_weights(c, cu, 0.8, 0.4)
    # seq 0, K = int(5 * 0.8) = 4 of p+: {0.9, 0.7, 0.6, 0.2} -> (p - 0.2) / 0.7
    # seq 1, K = int(0.8) = 0 -> 1 (kept token gets 1)
    # seq 2, K = int(2.4) = 2 equal values -> 1, ties broken by the earliest tokens
    want_pos = [1.0, 0.0, 4 / 7, 5 / 7, 0.0] + [1.0] + [1.0, 1.0, 0.0]
    torch.testing.assert_close(w_pos, torch.tensor(want_pos), atol=1e-5, rtol=0)
    # seq 0, K = int(2.0) = 2 of p- = {0.1, 0.8, 0.4, 0.3, 0.9}: {0.9, 0.8} -> 1, 0
    # seq 1, K = 1; seq 2 K = int(1.2) = 1, ties: the earliest token
    want_neg = [0.0, 0.0, 0.0, 0.0, 1.0] + [1.0] + [1.0, 0.0, 0.0]
    torch.testing.assert_close(w_neg, torch.tensor(want_neg), atol=1e-5, rtol=0)


def _kwargs(threshold: bool, topk: bool) -> dict:
    return dict(
        threshold_rescale=threshold, correct_threshold=0.5, incorrect_threshold=0.5,
        topk_rescale=topk, correct_topk_ratio=0.5, incorrect_topk_ratio=0.5,
    )


@pytest.mark.parametrize("threshold,topk", [(True, False), (True, True), (False, True)])
def test_rm_token_weights_dispatch(threshold, topk):
    c = torch.tensor([0.5, -0.2, 1.0, -3.0, 0.1])
    got = rm_token_weights(c, CU, **_kwargs(threshold, topk))
    want = threshold_weights(c, 0.5, 0.5) if threshold else topk_weights(c, CU, 0.5, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_rm_token_weights_needs_a_mode():
    with pytest.raises(ValueError, match="threshold_rescale"):
        rm_token_weights(torch.zeros(5), CU, **_kwargs(False, False))


@pytest.mark.parametrize("tau", [1.0, -0.1])
def test_bad_threshold_raises(tau):
    with pytest.raises(ValueError, match="correct_threshold"):
        threshold_weights(torch.zeros(2), tau, 0.5)


def _random_packed(lens, seed):
    g = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(sum(lens), generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    return scores, cu


@pytest.mark.parametrize("lens", [[20_000, 1, 7_000], [5, 5, 5, 5]])
def test_cumulative_means_long_sequences_vs_fp64_loop(lens):
    scores, cu = _random_packed(lens, seed=len(lens))
    want = torch.cat([
        torch.cumsum(scores[a:b].double(), 0) / torch.arange(1, b - a + 1)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())
    ])
    torch.testing.assert_close(cumulative_means(scores, cu).double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_topk_vectorised_equals_per_sequence_topk(ratio):
    lens = [13, 1, 40, 7]
    c, cu = _random_packed(lens, seed=3)
    w_pos, _ = topk_weights(c, cu, ratio, ratio)
    want = torch.zeros_like(c)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        p = torch.sigmoid(c[a:b].double())
        k = max(int((b - a) * ratio), 1)
        vals, idx = torch.topk(p, k)
        span = vals.max() - vals.min()
        want[a + idx] = ((vals - vals.min()) / span if span > 0 else torch.ones(k)).float()
    torch.testing.assert_close(w_pos, want)


def _exact_minmax(cs: list[float]) -> list[float]:
    """(p - min p) / (max p - min p) with p = sigmoid(c) near 1, via 1 - p = 1 / (1 + e^c)."""
    q = [1 / (1 + math.exp(x)) for x in cs]  # 1 - p: tiny, and exact to fp64 rounding
    return [(max(q) - x) / (max(q) - min(q)) for x in q]


@pytest.mark.parametrize("cs", [[10.0, 11.0, 12.0], [16.0, 17.0, 18.0], [40.0, 40.5, 43.0]])
def test_topk_minmax_exact_for_a_confident_rm(cs):
    # fp32 sigmoids of these running means are within a few ulps of 1 (all 1.0 at 40): the
    # middle weight came out 0.7325 and 1.0 for the first two where the exact one is 0.7311.
    c = torch.tensor(cs + [-x for x in cs])
    cu = torch.tensor([0, 3, 6])
    w_pos, w_neg = topk_weights(c, cu, 1.0, 1.0)
    torch.testing.assert_close(w_pos[:3], torch.tensor(_exact_minmax(cs)), rtol=1e-6, atol=1e-7)
    # the same sequence seen as wrong by a confident RM: p- = 1 - sigmoid(-c) near 1
    torch.testing.assert_close(w_neg[3:], torch.tensor(_exact_minmax(cs)), rtol=1e-6, atol=1e-7)
    # and the mirrored sides: p+ of the negated sequence and p- of the first are tiny, no loss
    p_small = [1 / (1 + math.exp(x)) for x in cs]
    want_small = [(x - min(p_small)) / (max(p_small) - min(p_small)) for x in p_small]
    torch.testing.assert_close(w_neg[:3], torch.tensor(want_small), rtol=1e-6, atol=1e-7)
