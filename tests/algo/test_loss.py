import math

import pytest
import torch

from oreal_fast.algo import (
    ActorLossInputs,
    LossCoefficients,
    Normalisers,
    actor_metric_sums,
    actor_metrics,
    kl_penalty,
    oreal_actor_loss,
    oreal_logprob_grad,
)
from oreal_fast.algo import loss as loss_module

H, V = 8, 11
LENS = [3, 4, 2]  # positive, negative, negative
REWARDS = [1.0, -1.0, -1.0]
ADV = [1.6, -0.5333, -1.2]


def _norm(n_act, n_pos, n_neg, m) -> Normalisers:
    return Normalisers(*(torch.tensor(x) for x in (n_act, n_pos, n_neg, m)))


# Global counts of a step in which these 3 sequences are one micro-batch of several.
NORM = _norm(40, 15, 25, 8)


def _coefs(kl_type="unbias", pos_mult_adv=True):
    return LossCoefficients(positive_loss_factor=1.0, negative_loss_factor=0.5, kl_coef=0.01,
                            kl_type=kl_type, pos_mult_adv=pos_mult_adv)


def _tiny_model(seed=0):
    """A linear LM head over fixed hidden states; log_softmax gather of sampled labels."""
    g = torch.Generator().manual_seed(seed)
    t = sum(LENS)
    hidden = torch.randn(t, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    ref_weight = weight.detach() + 0.3 * torch.randn(V, H, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (t,), generator=g)
    w_pos = torch.rand(t, generator=g, dtype=torch.float64)
    w_neg = torch.rand(t, generator=g, dtype=torch.float64)
    return hidden, weight, ref_weight, labels, w_pos, w_neg


def _per_token(values):
    return torch.tensor([v for v, n in zip(values, LENS) for _ in range(n)], dtype=torch.float64)


def _inputs(seed=0):
    hidden, weight, ref_weight, labels, w_pos, w_neg = _tiny_model(seed)
    logits = hidden @ weight.T
    logits.retain_grad()
    lp = torch.log_softmax(logits, -1).gather(1, labels[:, None])[:, 0]
    lp.retain_grad()
    ref = torch.log_softmax(hidden @ ref_weight.T, -1).gather(1, labels[:, None])[:, 0]
    adv = _per_token(ADV)
    pos = _per_token(REWARDS) > 0
    return logits, lp, ref, labels, adv, pos, w_pos, w_neg


def _hand_loss(lp, ref, w_pos, w_neg, kl_type, pos_mult_adv):
    """The 4.11 global objective written per sequence and token, in Python floats."""
    lp, ref, w_pos, w_neg = (x.tolist() for x in (lp, ref, w_pos, w_neg))
    pos_sum = neg_sum = kl_sum = 0.0
    t = 0
    for r, a, n in zip(REWARDS, ADV, LENS):
        for _ in range(n):
            d = ref[t] - lp[t]
            k = {"unbias": math.exp(d) - d - 1, "kl": d, "mse": d * d / 2}[kl_type]
            kl_sum += k
            if r > 0:
                pos_sum += w_pos[t] * -lp[t] * (a if pos_mult_adv else 1.0)
            else:
                neg_sum += a * w_neg[t]
            t += 1
    return 1.0 * pos_sum / 15, -0.5 * neg_sum / 25, 0.01 * kl_sum / 40


@pytest.mark.parametrize("kl_type", ["unbias", "kl", "mse"])
@pytest.mark.parametrize("pos_mult_adv", [True, False])
def test_loss_terms_match_hand_formula(kl_type, pos_mult_adv):
    _, lp, ref, _, adv, pos, w_pos, w_neg = _inputs()
    terms = oreal_actor_loss(lp, ActorLossInputs(ref, adv, pos, w_pos, w_neg, NORM), _coefs(kl_type, pos_mult_adv))
    want = _hand_loss(lp, ref, w_pos, w_neg, kl_type, pos_mult_adv)
    got = [terms.positive_loss.item(), terms.negative_loss.item(), terms.kl_penalty_loss.item()]
    assert got == pytest.approx(want, rel=1e-5)
    assert terms.loss.item() == pytest.approx(sum(want), rel=1e-5)
    assert not terms.positive_loss.requires_grad and terms.loss.requires_grad


@pytest.mark.parametrize("kl_type", ["unbias", "kl", "mse"])
@pytest.mark.parametrize("pos_mult_adv", [True, False])
def test_grad_g_equals_autograd_on_tiny_model(kl_type, pos_mult_adv):
    logits, lp, ref, labels, adv, pos, w_pos, w_neg = _inputs(seed=1)
    coefs = _coefs(kl_type, pos_mult_adv)
    oreal_actor_loss(lp, ActorLossInputs(ref, adv, pos, w_pos, w_neg, NORM), coefs).loss.backward()
    g = oreal_logprob_grad(lp, ActorLossInputs(ref, adv, pos, w_pos, w_neg, NORM), coefs).double()
    torch.testing.assert_close(lp.grad, g, rtol=1e-5, atol=1e-9)
    # dL/dz_t = g_t (onehot(a_t) - softmax(z_t)) for the logits
    onehot = torch.nn.functional.one_hot(labels, V).double()
    want_dz = g[:, None] * (onehot - torch.softmax(logits.detach(), -1))
    torch.testing.assert_close(logits.grad, want_dz, rtol=1e-5, atol=1e-9)


def test_g_hand_unbias():
    _, lp, ref, _, adv, pos, w_pos, w_neg = _inputs(seed=2)
    g = oreal_logprob_grad(lp, ActorLossInputs(ref, adv, pos, w_pos, w_neg, NORM), _coefs())
    want = []
    t = 0
    for r, a, n in zip(REWARDS, ADV, LENS):
        for _ in range(n):
            kl = 0.01 / 40 * (1 - math.exp(ref[t].item() - lp[t].item()))
            bc = -(1.0 / 15) * a * w_pos[t].item() if r > 0 else -(0.5 / 25) * a * w_neg[t].item()
            want.append(bc + kl)
            t += 1
    torch.testing.assert_close(g, torch.tensor(want, dtype=torch.float32), rtol=1e-5, atol=1e-10)


def test_worked_example_10_1():
    # c = 4: correct A = 1.6, incorrect A = -8/15; N_pos 60000, N_neg 110000, N_act 170000.
    norm = _norm(170_000, 60_000, 110_000, 100)
    lp = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    w = torch.tensor([0.25, 0.5, 1.0, 0.75])
    adv = torch.tensor([1.6, 1.6, -8 / 15, -8 / 15])
    pos = torch.tensor([True, True, False, False])
    g = oreal_logprob_grad(lp, ActorLossInputs(lp.clone(), adv, pos, w, w, norm), _coefs())
    # reference: correct g = -(1/60000) 1.6 w+, incorrect g = +2.424e-6 w- (KL part 0 here)
    want = [-(1 / 60000) * 1.6 * 0.25, -(1 / 60000) * 1.6 * 0.5, 2.424e-6, 2.424e-6 * 0.75]
    torch.testing.assert_close(g, torch.tensor(want), rtol=2e-4, atol=0)


def test_negative_value_is_sum_a_w():
    _, lp, ref, _, adv, pos, w_pos, w_neg = _inputs()
    terms = oreal_actor_loss(lp, ActorLossInputs(ref, adv, pos, w_pos, w_neg, NORM), _coefs())
    neg = [(a, n) for r, a, n in zip(REWARDS, ADV, LENS) if r <= 0]
    w = w_neg[LENS[0]:].tolist()
    want = -0.5 / 25 * (neg[0][0] * sum(w[:neg[0][1]]) + neg[1][0] * sum(w[neg[0][1]:]))
    assert terms.negative_loss.item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("kl_type", ["unbias", "mse"])
def test_kl_zero_value_and_grad_at_reference(kl_type):
    lp = torch.tensor([-0.3, -2.0, -7.5], requires_grad=True)
    k = kl_penalty(lp, lp.detach().clone(), kl_type)
    k.sum().backward()
    assert torch.equal(k, torch.zeros(3)) and torch.equal(lp.grad, torch.zeros(3))


def test_kl_type_kl_zero_value_at_reference():
    lp = torch.tensor([-0.3, -2.0])
    assert torch.equal(kl_penalty(lp, lp.clone(), "kl"), torch.zeros(2))


def test_no_rm_means_unit_weights():
    _, lp, ref, _, adv, pos, _, _ = _inputs()
    ones = torch.ones_like(lp)
    a = oreal_actor_loss(lp, ActorLossInputs(ref, adv, pos, None, None, NORM), _coefs())
    b = oreal_actor_loss(lp, ActorLossInputs(ref, adv, pos, ones, ones, NORM), _coefs())
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_no_positive_tokens_is_finite():
    lp = torch.tensor([-1.0, -2.0])
    adv, pos = torch.tensor([-0.5, -0.5]), torch.tensor([False, False])
    terms = oreal_actor_loss(lp, ActorLossInputs(lp - 0.1, adv, pos, None, None, _norm(2, 0, 2, 1)), _coefs())
    assert terms.positive_loss.item() == 0.0 and torch.isfinite(terms.loss)


def test_bad_kl_type_raises():
    with pytest.raises(ValueError, match="kl_type"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k2")
    with pytest.raises(ValueError, match="kl_type"):
        _coefs(kl_type="k2")


def test_metrics_official_definitions():
    lp = torch.tensor([-1.0, -2.0, -3.0, -0.5, -0.5])  # sequences of 3 and 2 tokens
    ref = torch.tensor([-1.5, -2.0, -2.0, -1.0, 0.0])
    s = actor_metric_sums(lp, ref, torch.tensor([1.6, -8 / 15]))
    m = actor_metrics(s)
    assert m["avg_adv"].item() == pytest.approx((1.6 - 8 / 15) / 5, rel=1e-6)
    assert m["avg_gen_entropy"].item() == pytest.approx(7.0 / 5, rel=1e-6)
    assert m["avg_ref_kl"].item() == pytest.approx((0.5 + 0 - 1 + 0.5 - 0.5) / 5, rel=1e-6)


def _k3_series(d: float) -> float:
    """exp(d) - d - 1 = sum_{n>=2} d^n / n!, summed in fp64 (no cancellation for |d| <= 1)."""
    return sum(d**n / math.factorial(n) for n in range(2, 25))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_k3_value_and_grad_vs_fp64_for_close_policies(sign):
    # |d| = 1e-4 is the first steps after the freeze: fp32 exp(d) - d - 1 is all rounding there.
    lp = torch.tensor([-1.0, -0.5, -2.0, -0.25])
    ref = lp + sign * torch.tensor([1e-6, 1e-4, 1e-2, 1.0])
    d = (ref.double() - lp.double()).tolist()  # exact: the fp32 inputs' own difference
    lp.requires_grad_(True)
    k = kl_penalty(lp, ref, "unbias")
    k.sum().backward()
    want = torch.tensor([_k3_series(x) for x in d], dtype=torch.float64)
    torch.testing.assert_close(k.double(), want, rtol=1e-6, atol=0)
    # dk/dl = 1 - exp(d): autograd is exact to fp32 rounding; the closed form (fp32, also the
    # fused kernel's) is within an fp32 rounding of 1.
    want_grad = torch.tensor([-math.expm1(x) for x in d], dtype=torch.float64)
    torch.testing.assert_close(lp.grad.double(), want_grad, rtol=1e-6, atol=0)
    closed = loss_module.kl_penalty_grad(lp.detach(), ref, "unbias").double()
    torch.testing.assert_close(closed, want_grad, rtol=0, atol=2.5e-7)


def test_logged_kl_loss_vs_fp64_at_small_d():
    lp = torch.full((1000,), -1.3)
    ref = lp + 1e-4
    inputs = ActorLossInputs(ref, torch.zeros(1000), torch.zeros(1000, dtype=torch.bool), None, None,
                             _norm(1000, 0, 1000, 10))
    terms = oreal_actor_loss(lp, inputs, _coefs())
    d = (ref[0].double() - lp[0].double()).item()
    want = 0.01 / 1000 * 1000 * _k3_series(d)
    assert terms.kl_penalty_loss.item() == pytest.approx(want, rel=1e-5)
