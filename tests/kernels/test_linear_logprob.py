"""Parity of linear_logprob (Triton and eager) with an independent fp64 autograd reference.

CPU: fp32 inputs under TRITON_INTERPRET=1, small shapes chosen so that T and V are not multiples
of any tile. GPU (skipped without CUDA): the same cases, plus bf16 at the Qwen2.5-0.5B head shape
with poisoned allocations to catch unwritten outputs.
"""

import importlib
import math
import os

import pytest
import torch

from oreal_fast.kernels import IGNORE_INDEX, linear_logprob

# The module itself (the package re-exports a function of the same name).
ll = importlib.import_module("oreal_fast.kernels.linear_logprob")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(T, H, V, device, dtype=torch.float32, ignore_frac=0.2, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(T, H, generator=g) / math.sqrt(H) * 4
    weight = torch.randn(V, H, generator=g)
    labels = torch.randint(0, V, (T,), generator=g)
    labels[torch.rand(T, generator=g) < ignore_frac] = IGNORE_INDEX
    g_lp = torch.randn(T, generator=g)
    g_ent = torch.randn(T, generator=g)
    to = dict(device=device)
    return (hidden.to(dtype=dtype, **to), weight.to(dtype=dtype, **to), labels.to(**to),
            g_lp.to(**to), g_ent.to(**to))


def _reference(hidden, weight, labels, temperature, g_lp, g_ent, rows=256):
    """fp64 logprobs, entropy, dH, dW by autograd over full-vocabulary logits, chunk by chunk."""
    W = weight.double().requires_grad_()
    lps, ents, dHs = [], [], []
    dW = torch.zeros_like(W)
    for t0 in range(0, hidden.shape[0], rows):
        h = hidden[t0:t0 + rows].double().requires_grad_()
        lab = labels[t0:t0 + rows]
        keep = lab != IGNORE_INDEX
        logp = torch.log_softmax(h @ W.T / temperature, -1)  # (rows, V)
        lp = torch.where(keep, logp.gather(-1, lab.clamp(min=0)[:, None])[:, 0], 0.0)
        ent = torch.where(keep, -(logp.exp() * logp).sum(-1), 0.0)
        loss = (lp * g_lp[t0:t0 + rows].double()).sum()
        if g_ent is not None:
            loss = loss + (ent * g_ent[t0:t0 + rows].double()).sum()
        dh, dw = torch.autograd.grad(loss, (h, W))
        lps.append(lp.detach())
        ents.append(ent.detach())
        dHs.append(dh)
        dW += dw
    return torch.cat(lps), torch.cat(ents), torch.cat(dHs), dW


def _assert_close(name, got, ref, rtol):
    """Norm-wise relative error; on failure names the worst element and both values."""
    got64 = got.detach().double()
    assert torch.isfinite(got64).all(), f"{name}: {int((~torch.isfinite(got64)).sum())} non-finite"
    err = (got64 - ref).norm() / ref.norm().clamp_min(1e-30)
    if err > rtol:
        worst = (got64 - ref).abs().argmax()
        idx = tuple(int(i) for i in torch.unravel_index(worst, ref.shape))
        raise AssertionError(f"{name}: relative error {err:.3e} > {rtol:.0e}; worst at {idx}: "
                             f"kernel {got64[idx]:.9g}, fp64 {ref[idx]:.9g}")


def _run(hidden, weight, labels, temperature, g_lp, g_ent, impl):
    h = hidden.detach().clone().requires_grad_()
    W = weight.detach().clone().requires_grad_()
    lp, ent = linear_logprob(h, W, labels, temperature=temperature, return_entropy=True, impl=impl)
    loss = (lp * g_lp).sum()
    if g_ent is not None:
        loss = loss + (ent * g_ent).sum()
    loss.backward()
    return lp, ent, h.grad, W.grad


SHAPES = [(37, 40, 203), (64, 32, 128), (5, 16, 20), (70, 24, 333)]


@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize("with_ent_grad", [False, True], ids=["lp_grad", "lp_ent_grad"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("T,H,V", SHAPES, ids=[f"T{t}-H{h}-V{v}" for t, h, v in SHAPES])
def test_matches_fp64(T, H, V, temperature, with_ent_grad, impl, device):
    hidden, weight, labels, g_lp, g_ent = _inputs(T, H, V, device)
    g_ent = g_ent if with_ent_grad else None
    lp, ent, dH, dW = _run(hidden, weight, labels, temperature, g_lp, g_ent, impl)
    r_lp, r_ent, r_dH, r_dW = _reference(hidden, weight, labels, temperature, g_lp, g_ent)
    _assert_close("logprobs", lp, r_lp, 1e-5)
    _assert_close("entropy", ent, r_ent, 1e-5)
    _assert_close("dH", dH, r_dH, 1e-4)
    _assert_close("dW", dW, r_dW, 1e-4)


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_peaked_logits(impl, device):
    """Planted large logits (hidden copied into weight rows): entropy near 0 stays accurate."""
    hidden, weight, labels, g_lp, g_ent = _inputs(33, 32, 150, device, ignore_frac=0.0)
    weight[labels[:20]] = hidden[:20] * 8
    lp, ent, dH, dW = _run(hidden, weight, labels, 1.0, g_lp, g_ent, impl)
    r_lp, r_ent, r_dH, r_dW = _reference(hidden, weight, labels, 1.0, g_lp, g_ent)
    _assert_close("logprobs", lp, r_lp, 1e-5)
    _assert_close("entropy", ent, r_ent, 1e-5)
    _assert_close("dH", dH, r_dH, 1e-4)
    _assert_close("dW", dW, r_dW, 1e-4)


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_ignored_rows_are_exactly_zero(impl, device):
    hidden, weight, labels, g_lp, g_ent = _inputs(40, 24, 90, device, ignore_frac=0.5)
    ignored = labels == IGNORE_INDEX
    lp, ent, dH, _ = _run(hidden, weight, labels, 1.0, g_lp, g_ent, impl)
    assert (lp[ignored] == 0).all() and (ent[ignored] == 0).all()
    assert (dH[ignored] == 0).all()


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_all_ignored_gives_zero_everything(impl, device):
    hidden, weight, _, g_lp, g_ent = _inputs(19, 16, 50, device)
    labels = torch.full((19,), IGNORE_INDEX, device=device)
    lp, ent, dH, dW = _run(hidden, weight, labels, 1.0, g_lp, g_ent, impl)
    assert (lp == 0).all() and (ent == 0).all()
    assert (dH == 0).all() and (dW == 0).all()


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_no_grad_path_matches_and_saves_nothing(impl, device):
    hidden, weight, labels, *_ = _inputs(37, 40, 203, device)
    hidden.requires_grad_()
    with torch.no_grad():
        lp, ent = linear_logprob(hidden, weight, labels, return_entropy=True, impl=impl)
    assert lp.grad_fn is None and ent.grad_fn is None
    r_lp, r_ent, *_ = _reference(hidden.detach(), weight, labels, 1.0,
                                 torch.zeros_like(labels, dtype=torch.float32), None)
    _assert_close("logprobs", lp, r_lp, 1e-5)
    _assert_close("entropy", ent, r_ent, 1e-5)


def test_backward_in_several_vocab_chunks(monkeypatch, device):
    """The dz chunk bound splits V into several chunks; dH must add up across them."""
    hidden, weight, labels, g_lp, g_ent = _inputs(37, 40, 203, device)
    monkeypatch.setattr(ll, "_DZ_CHUNK_BYTES", 37 * 4 * 64)  # 64 columns per chunk: 4 chunks
    lp, ent, dH, dW = _run(hidden, weight, labels, 1.0, g_lp, g_ent, "triton")
    _, _, r_dH, r_dW = _reference(hidden, weight, labels, 1.0, g_lp, g_ent)
    _assert_close("dH", dH, r_dH, 1e-4)
    _assert_close("dW", dW, r_dW, 1e-4)


def test_eager_in_several_row_chunks(monkeypatch, device):
    hidden, weight, labels, g_lp, g_ent = _inputs(37, 40, 203, device)
    monkeypatch.setattr(ll, "_EAGER_CHUNK_ELEMS", 203 * 8)  # 8 rows per chunk
    lp, ent, dH, dW = _run(hidden, weight, labels, 0.7, g_lp, g_ent, "eager")
    r_lp, r_ent, r_dH, r_dW = _reference(hidden, weight, labels, 0.7, g_lp, g_ent)
    _assert_close("logprobs", lp, r_lp, 1e-5)
    _assert_close("dW", dW, r_dW, 1e-4)


def test_logprob_only_output(device):
    hidden, weight, labels, *_ = _inputs(20, 16, 64, device)
    out = linear_logprob(hidden, weight, labels)
    assert isinstance(out, torch.Tensor) and out.shape == (20,) and out.dtype == torch.float32


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(labels=lambda lab: lab.int()), "labels must be \\[T\\] int64"),
        (dict(weight=lambda w: w[:, :-1]), "hidden must be \\[T, H\\] and weight \\[V, H\\]"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(impl="cuda"), "impl must be one of"),
    ],
    ids=["label_dtype", "hidden_size", "temperature", "impl"],
)
def test_bad_arguments_name_the_fault(change, match):
    hidden, weight, labels, *_ = _inputs(4, 16, 32, "cpu")
    args = dict(hidden=hidden, weight=weight, labels=labels)
    kwargs = {}
    for key, value in change.items():
        if key in args:
            args[key] = value(args[key])
        else:
            kwargs[key] = value
    with pytest.raises(ValueError, match=match):
        linear_logprob(args["hidden"], args["weight"], args["labels"], **kwargs)


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_label_out_of_range_names_the_labels(impl):
    # CPU only: on a GPU the check is a device-side assert, which ends the CUDA context.
    if impl == "triton" and not INTERPRET:
        pytest.skip("the Triton path on CPU needs TRITON_INTERPRET=1")
    hidden, weight, labels, *_ = _inputs(4, 16, 32, "cpu", ignore_frac=0.0)
    labels[2] = 32
    with pytest.raises(RuntimeError, match="labels must be in \\[0, 32\\) or -100"):
        linear_logprob(hidden, weight, labels, impl=impl)


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_empty_batch_gives_empty_outputs_and_zero_grads(impl, device):
    hidden, weight, labels, *_ = _inputs(0, 16, 32, device)
    hidden.requires_grad_()
    weight.requires_grad_()
    lp, ent = linear_logprob(hidden, weight, labels, return_entropy=True, impl=impl)
    (lp.sum() + ent.sum()).backward()
    assert lp.shape == ent.shape == (0,)
    assert weight.grad is not None and (weight.grad == 0).all()


@needs_cuda
@pytest.mark.parametrize("with_ent_grad", [False, True], ids=["lp_grad", "lp_ent_grad"])
def test_bf16_real_shape_matches_fp64(with_ent_grad, poison_cuda_allocator):
    """Qwen2.5-0.5B head, one 16k-token micro-batch, bf16 inputs."""
    T, H, V = 16384, 896, 151936
    hidden, weight, labels, g_lp, g_ent = _inputs(T, H, V, "cuda", torch.bfloat16, ignore_frac=0.1)
    g_ent = g_ent if with_ent_grad else None
    poison_cuda_allocator()
    lp, ent, dH, dW = _run(hidden, weight, labels, 1.0, g_lp, g_ent, "triton")
    torch.cuda.synchronize()
    r_lp, r_ent, r_dH, r_dW = _reference(hidden, weight, labels, 1.0, g_lp, g_ent, rows=2048)
    _assert_close("logprobs", lp, r_lp, 1e-4)
    _assert_close("entropy", ent, r_ent, 1e-4)
    _assert_close("dH", dH, r_dH, 5e-3)
    _assert_close("dW", dW, r_dW, 5e-3)


@needs_cuda
def test_bf16_forward_only_poisoned(poison_cuda_allocator):
    T, H, V = 4099, 896, 151936
    hidden, weight, labels, *_ = _inputs(T, H, V, "cuda", torch.bfloat16, ignore_frac=0.1)
    poison_cuda_allocator()
    with torch.no_grad():
        lp, ent = linear_logprob(hidden, weight, labels, return_entropy=True)
    torch.cuda.synchronize()
    r_lp, r_ent, *_ = _reference(hidden, weight, labels, 1.0,
                                 torch.zeros(T, device="cuda"), None, rows=2048)
    _assert_close("logprobs", lp, r_lp, 1e-4)
    _assert_close("entropy", ent, r_ent, 1e-4)


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_under_autocast_the_kernel_casts_its_operands_itself(impl, device):
    """Under autocast a caller hands the fp32 final-norm states with an fp32 or already cast head:
    the kernel casts both to the autocast dtype, as autocast would a matmul's operands, and computes
    the rest with autocast off (an autocast matmul inside the eager twin would round the logits)."""
    if device == "cpu" and impl == "triton":
        pytest.skip("the interpreter's low-precision dot is wrong: the Triton path takes fp32 only on CPU")
    low = torch.bfloat16
    hidden, weight, labels, *_ = _inputs(12, 16, 40, device)
    want = linear_logprob(hidden.to(low), weight.to(low), labels, impl=impl)
    with torch.autocast(device, dtype=low):
        got = linear_logprob(hidden, weight, labels, impl=impl)
        mixed = linear_logprob(hidden, weight.to(low), labels, impl=impl)
    assert got.dtype == torch.float32
    assert torch.equal(got, want) and torch.equal(mixed, want)
