"""Parity of fused_oreal_loss (Triton) with its eager twin run in fp64, values and gradients.

CPU: fp32 inputs under TRITON_INTERPRET=1, small odd shapes, chunk boundaries inside T.
GPU (skipped without CUDA): bf16 at the Qwen2.5-0.5B head shape with poisoned allocations.
"""

import importlib
import math

import pytest
import torch

from oreal_fast.algo.loss import ActorLossInputs, LossCoefficients
from oreal_fast.algo.normalisers import Normalisers
from oreal_fast.kernels import IGNORE_INDEX, fused_oreal_loss, linear_logprob_eager

fo = importlib.import_module("oreal_fast.kernels.fused_oreal_loss")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TERMS = ("loss", "positive_loss", "negative_loss", "kl_penalty_loss")


def _inputs(T, H, V, device, dtype=torch.float32, ignore_frac=0.2, rm_weights=True, seed=0):
    """Random head, labels and per-token loss inputs; the reference log-probs are the actor's
    (fp64) plus noise, so the KL terms see realistic |lref - l| < 1."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = (torch.randn(T, H, generator=g) / math.sqrt(H) * 4).to(dtype)
    weight = torch.randn(V, H, generator=g).to(dtype)
    labels = torch.randint(0, V, (T,), generator=g)
    labels[torch.rand(T, generator=g) < ignore_frac] = IGNORE_INDEX
    with torch.no_grad():  # on the device, in row chunks: real shapes stay cheap
        lp = linear_logprob_eager(hidden.to(device).double(), weight.to(device).double(),
                                  labels.to(device)).cpu()
    ref = (lp + 0.3 * torch.randn(T, generator=g, dtype=torch.float64)).float()
    is_positive = torch.rand(T, generator=g) < 0.4
    adv = torch.where(is_positive, 1.0, -0.7) + 0.2 * torch.randn(T, generator=g)
    w_pos = torch.rand(T, generator=g) if rm_weights else None
    w_neg = torch.rand(T, generator=g) if rm_weights else None
    n_pos = int(is_positive.sum()) + 5
    norm = Normalisers(*(torch.tensor(n, device=device) for n in (3 * T, n_pos, 3 * T - n_pos, 9)))
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    return dict(hidden=to(hidden), weight=to(weight), labels=to(labels), ref_logprobs=to(ref),
                advantages=to(adv), is_positive=to(is_positive), w_pos=to(w_pos),
                w_neg=to(w_neg), norm=norm)


def _coefs(kl_type="unbias", pos_mult_adv=True):
    return LossCoefficients(positive_loss_factor=1.0, negative_loss_factor=0.5, kl_coef=0.05,
                            kl_type=kl_type, pos_mult_adv=pos_mult_adv)


def _call(inp, coefs, impl, dtype=None, grad=True):
    """(terms, logprobs, dH, dW); hidden and weight as leaves of `dtype` (default: as given)."""
    args = dict(inp)
    h = args.pop("hidden").detach().to(dtype or inp["hidden"].dtype).requires_grad_(grad)
    w = args.pop("weight").detach().to(dtype or inp["weight"].dtype).requires_grad_(grad)
    labels = args.pop("labels")
    terms, lp = fused_oreal_loss(h, w, labels, ActorLossInputs(**args), coefs, impl=impl)
    if grad:
        terms.loss.backward()
    return terms, lp, h.grad, w.grad


def _assert_close(name, got, ref, rtol):
    """Norm-wise relative error; on failure names the worst element and both values."""
    got64, ref64 = got.detach().double().reshape(-1), ref.detach().double().reshape(-1)
    assert torch.isfinite(got64).all(), f"{name}: {int((~torch.isfinite(got64)).sum())} non-finite"
    err = (got64 - ref64).norm() / ref64.norm().clamp_min(1e-30)
    if err > rtol:
        i = int((got64 - ref64).abs().argmax())
        raise AssertionError(f"{name}: relative error {err:.3e} > {rtol:.0e}; worst at {i}: "
                             f"kernel {got64[i]:.9g}, fp64 {ref64[i]:.9g}")


def _assert_matches_fp64(inp, coefs, got, rtol_terms, rtol_grads):
    terms, lp, dH, dW = got
    r_terms, r_lp, r_dH, r_dW = _call(inp, coefs, "eager", dtype=torch.float64)
    for name in TERMS:
        _assert_close(name, getattr(terms, name), getattr(r_terms, name), rtol_terms)
    _assert_close("logprobs", lp, r_lp, rtol_terms)
    _assert_close("dH", dH, r_dH, rtol_grads)
    _assert_close("dW", dW, r_dW, rtol_grads)


SHAPES = [(37, 40, 203, None), (70, 24, 333, 16), (5, 16, 20, 2)]


@pytest.mark.parametrize("rm_weights", [True, False], ids=["rm_weights", "no_rm"])
@pytest.mark.parametrize("pos_mult_adv", [True, False], ids=["pos_adv", "pos_plain"])
@pytest.mark.parametrize("kl_type", ["unbias", "kl", "mse"])
@pytest.mark.parametrize("T,H,V,chunk", SHAPES,
                         ids=[f"T{t}-H{h}-V{v}-chunk{c}" for t, h, v, c in SHAPES])
def test_matches_eager_fp64(T, H, V, chunk, kl_type, pos_mult_adv, rm_weights, device,
                            monkeypatch):
    if chunk is not None:
        monkeypatch.setattr(fo, "_CHUNK_ROWS", chunk)  # chunk boundaries fall inside T
    inp = _inputs(T, H, V, device, rm_weights=rm_weights)
    coefs = _coefs(kl_type, pos_mult_adv)
    _assert_matches_fp64(inp, coefs, _call(inp, coefs, "triton"), 1e-5, 1e-4)


def test_ignored_rows_have_zero_logprob_and_zero_grad(device):
    inp = _inputs(40, 24, 90, device, ignore_frac=0.5)
    ignored = inp["labels"] == IGNORE_INDEX
    _, lp, dH, _ = _call(inp, _coefs(), "triton")
    assert (lp[ignored] == 0).all()
    assert (dH[ignored] == 0).all()


def test_all_ignored_gives_zero_grads(device):
    inp = _inputs(19, 16, 50, device, ignore_frac=1.0)
    _, lp, dH, dW = _call(inp, _coefs(), "triton")
    assert (lp == 0).all() and (dH == 0).all() and (dW == 0).all()


@pytest.mark.parametrize("mode", ["no_grad", "no_requires_grad"])
def test_without_grad_no_gradient_work(mode, device, monkeypatch):
    """Same values, no graph, and the forward is asked for neither dH nor dW."""
    asked = []
    forward = fo._forward

    def spy(*args):
        out = forward(*args)
        asked.append((out[1], out[2]))
        return out

    monkeypatch.setattr(fo, "_forward", spy)
    inp = _inputs(37, 40, 203, device)
    coefs = _coefs()
    if mode == "no_grad":
        with torch.no_grad():
            terms, lp, _, _ = _call(inp, coefs, "triton", grad=False)
    else:
        terms, lp, _, _ = _call(inp, coefs, "triton", grad=False)
    assert asked == [(None, None)]
    assert terms.loss.grad_fn is None
    r_terms, r_lp, _, _ = _call(inp, coefs, "eager", dtype=torch.float64)
    _assert_close("loss", terms.loss, r_terms.loss, 1e-5)
    _assert_close("logprobs", lp, r_lp, 1e-5)


def test_hidden_only_grad_skips_weight(device):
    inp = _inputs(37, 40, 203, device)
    h = inp["hidden"].clone().requires_grad_()
    args = {k: v for k, v in inp.items() if k not in ("hidden", "weight", "labels")}
    terms, _ = fused_oreal_loss(h, inp["weight"], inp["labels"], ActorLossInputs(**args), _coefs())
    terms.loss.backward()
    _, _, r_dH, _ = _call(inp, _coefs(), "eager", dtype=torch.float64)
    _assert_close("dH", h.grad, r_dH, 1e-4)


def test_incoming_gradient_scales_dh_dw(device):
    """loss * 3 back-propagates three times the gradients."""
    inp = _inputs(20, 16, 64, device)
    h = inp["hidden"].clone().requires_grad_()
    w = inp["weight"].clone().requires_grad_()
    args = {k: v for k, v in inp.items() if k not in ("hidden", "weight", "labels")}
    terms, _ = fused_oreal_loss(h, w, inp["labels"], ActorLossInputs(**args), _coefs())
    (3 * terms.loss).backward()
    _, _, r_dH, r_dW = _call(inp, _coefs(), "eager", dtype=torch.float64)
    _assert_close("dH", h.grad, 3 * r_dH, 1e-4)
    _assert_close("dW", w.grad, 3 * r_dW, 1e-4)


def test_eager_impl_is_the_twin():
    inp = _inputs(12, 8, 30, "cpu")
    got = _call(inp, _coefs("mse"), "eager")
    _assert_matches_fp64(inp, _coefs("mse"), got, 1e-5, 1e-4)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(ref_logprobs=lambda x: x[:-1]), "ref_logprobs must be \\[T\\]"),
        (dict(w_neg=lambda x: x.clone().requires_grad_()), "w_neg must not require grad"),
        (dict(kl_type="k2"), "kl_type must be one of"),
        (dict(impl="cuda"), "impl must be one of"),
    ],
    ids=["ref_shape", "w_neg_grad", "kl_type", "impl"],
)
def test_bad_arguments_name_the_fault(change, match):
    inp = _inputs(6, 8, 16, "cpu")
    coefs, impl = dict(_coefs().__dict__), "triton"
    for key, value in change.items():
        if key in inp:
            inp[key] = value(inp[key])
        elif key == "impl":
            impl = value
        else:
            coefs[key] = value
    with pytest.raises(ValueError, match=match):
        fused_oreal_loss(inp.pop("hidden"), inp.pop("weight"), inp.pop("labels"), ActorLossInputs(**inp),
                         LossCoefficients(**coefs), impl=impl)


@needs_cuda
@pytest.mark.parametrize("kl_type", ["unbias", "mse"])
def test_bf16_real_shape_matches_fp64(kl_type, poison_cuda_allocator):
    """Qwen2.5-0.5B head, one 16k-token micro-batch, bf16 inputs, several row chunks."""
    inp = _inputs(16384, 896, 151936, "cuda", torch.bfloat16, ignore_frac=0.1)
    coefs = _coefs(kl_type)
    poison_cuda_allocator()
    got = _call(inp, coefs, "triton")
    torch.cuda.synchronize()
    _assert_matches_fp64(inp, coefs, got, 1e-4, 5e-3)
