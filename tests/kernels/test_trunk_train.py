"""rms_norm, add_rms_norm, apply_rope, silu_mul for training: the Triton kernels against their eager
twins on fresh random inputs, forward and backward, and a decoder trained through `TRAIN_OPS`
against the eager decoder (hidden states and every parameter's gradient).

CPU: fp32 under TRITON_INTERPRET=1 (plus bf16 for the elementwise-only paths: autocast output and
a bf16 branch added to an fp32 residual; the interpreter truncates to bf16 where the GPU rounds,
still within one bf16 ulp), small and odd shapes. GPU: the dtypes training uses at
the Qwen2.5-0.5B shapes (fp32 residual and weights, bf16 branch and autocast output; bf16
q/k/gate/up) with 16384 tokens.

Tolerances. Forward: the kernels round where eager rounds, so they differ only by fp32 summation
order and the GPU's fused multiply-adds: fp32 results within 16 fp32 ulps (rope: bit-equal in the
interpreter), bf16 results within 2 bf16 ulps (one from an fp32 value on the other side of a
rounding boundary, one from an intermediate rounded one ulp apart). Backward: dx and dw of RMSNorm
are reductions in fp32 on both sides (over H, and over T for dw), so they are compared relative to
the size of what is summed: |got - ref| <= 1e-5 (fp32 ulps times the reduction depth) x the row's
(or column's) sum of |terms|; rope and SwiGLU gradients are elementwise, so the forward bounds hold.
"""

from contextlib import nullcontext

import pytest
import torch

from oreal_fast.cast_once import weights_cast_once
from oreal_fast.kernels.trunk_train import (TRAIN_OPS, add_rms_norm, add_rms_norm_eager, apply_rope,
                                            apply_rope_eager, rms_norm, rms_norm_eager, silu_mul, silu_mul_eager,
                                            silu_mul_packed, silu_mul_packed_eager, trunk_ops_for)
from oreal_fast.model.decoder import EAGER_OPS, Decoder, DecoderConfig, rope_table
from oreal_fast.recompute import apply_recompute, recompute_count


def _ulps(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest difference in units of the dtype's last place at the reference's magnitude."""
    eps = torch.finfo(ref.dtype).eps
    scale = ref.double().abs().clamp_min(torch.finfo(ref.dtype).tiny)
    return float(((got.double() - ref.double()).abs() / (scale * eps)).max())


def _max_ulps(dtype: torch.dtype) -> float:
    return 16.0 if dtype == torch.float32 else 2.0


def _probes(shapes: list[tuple[int, ...]], device: str, seed: int) -> list[torch.Tensor]:
    """The fixed random output gradients `_grads` backpropagates (fp32)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(device) for shape in shapes]


def _grads(fn, inputs: list[torch.Tensor], seed: int):
    """Outputs of fn(*inputs) and the gradients of sum(out * probe) w.r.t. every input (`_probes`)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    probes = _probes([o.shape for o in outs], str(outs[0].device), seed)
    sum((o.float() * p).sum() for o, p in zip(outs, probes)).backward()
    return [o.detach() for o in outs], [t.grad for t in leaves]


def _close_reduction(got: torch.Tensor, ref: torch.Tensor, terms: torch.Tensor, dim: int) -> None:
    """|got - ref| <= 1e-5 x (sum of |terms| over the reduced dim), element-wise."""
    bound = 1e-5 * terms.double().abs().sum(dim, keepdim=True) + 1e-30
    err = (got.double() - ref.double()).abs()
    worst = int((err / bound).argmax())
    assert (err <= bound).all(), (f"worst at flat index {worst}: got {got.flatten()[worst]}, "
                                  f"ref {ref.flatten()[worst]}, bound {bound.expand_as(err).flatten()[worst]}")


def _shapes(device: str) -> list[tuple[int, int]]:
    return [(1, 64), (300, 96), (5, 200)] if device == "cpu" else [(16384, 896)]


# ---------------------------------------------------------------------------------- RMSNorm

@pytest.mark.parametrize("case", range(3))
def test_rms_norm_forward_and_backward_match_eager(device, case):
    shapes = _shapes(device)
    T, H = shapes[case % len(shapes)]
    g = torch.Generator().manual_seed(T * H + case)
    x = (torch.randn(T, H, generator=g) * 3).to(device)  # fp32: the masters' residual stream
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(device)
    (y,), (dx, dw) = _grads(lambda a, b: rms_norm(a, b, 1e-6), [x, w], seed=case)
    (y_ref,), (dx_ref, dw_ref) = _grads(lambda a, b: rms_norm_eager(a, b, 1e-6), [x, w], seed=case)
    assert y.dtype == torch.float32 and _ulps(y, y_ref) <= 16
    (dy,) = _probes([(T, H)], device, seed=case)
    n = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    _close_reduction(dx, dx_ref, dy * w * n, dim=1)  # dx sums dy * w * n over the row
    _close_reduction(dw[None], dw_ref[None], dy * n, dim=0)  # dw sums dy * n over the rows


@pytest.mark.parametrize("case", range(3))
def test_add_rms_norm_forward_and_backward_match_eager(device, case):
    """An fp32 residual plus a branch output of the compute dtype (bf16; fp32 on CPU for case 0)."""
    shapes = _shapes(device)
    T, H = shapes[case % len(shapes)]
    g = torch.Generator().manual_seed(7 * T + H + case)
    delta_dtype = torch.float32 if (device == "cpu" and case == 0) else torch.bfloat16
    x = (torch.randn(T, H, generator=g) * 2).to(device)
    delta = torch.randn(T, H, generator=g).to(device, delta_dtype)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(device)
    (y, r), (dx, dd, dw) = _grads(lambda a, b, c: add_rms_norm(a, b, c, 1e-6), [x, delta, w], seed=case)
    (y_ref, r_ref), (dx_ref, dd_ref, dw_ref) = _grads(lambda a, b, c: add_rms_norm_eager(a, b, c, 1e-6),
                                                      [x, delta, w], seed=case)
    assert r.dtype == torch.float32 and torch.equal(r, r_ref)  # one fp32 add, both sides
    assert _ulps(y, y_ref) <= 16
    assert dd.dtype == delta_dtype and dx.dtype == torch.float32
    dy, dr = _probes([(T, H), (T, H)], device, seed=case)
    n = r.double() * torch.rsqrt(r.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    terms = torch.cat((dy * w * n, dr), dim=1)  # dx = the norm's row reduction + the residual's own gradient
    _close_reduction(dx, dx_ref, terms, dim=1)
    if delta_dtype == torch.bfloat16:  # dd is that fp32 sum rounded to bf16: one bf16 ulp, or the fp32 slack
        bound = torch.finfo(torch.bfloat16).eps * dd_ref.double().abs() + 1e-5 * terms.double().abs().sum(1, True)
        assert ((dd.double() - dd_ref.double()).abs() <= bound).all()
    else:
        _close_reduction(dd, dd_ref, terms, dim=1)
    _close_reduction(dw[None], dw_ref[None], dy * n, dim=0)


def test_norm_output_takes_the_autocast_dtype(device):
    """Under autocast the norms store what the next matmul would cast them to: eager's values in bf16."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(33, 96, generator=g).to(device), torch.randn(96, generator=g).to(device)
    delta = torch.randn(33, 96, generator=g).to(device, torch.bfloat16)
    with torch.autocast(device, dtype=torch.bfloat16):
        y, (y2, r2) = rms_norm(x, w, 1e-6), add_rms_norm(x, delta, w, 1e-6)
    assert y.dtype == y2.dtype == torch.bfloat16 and r2.dtype == torch.float32
    assert _ulps(y, rms_norm_eager(x, w, 1e-6).bfloat16()) <= 2
    assert _ulps(y2, add_rms_norm_eager(x, delta, w, 1e-6)[0].bfloat16()) <= 2


def test_bf16_weights_forward(device):
    """The frozen reference runs in bf16 throughout (no grad): forward against eager in bf16."""
    T, H = _shapes(device)[-1]
    g = torch.Generator().manual_seed(11)
    x = torch.randn(T, H, generator=g).to(device, torch.bfloat16)
    delta = torch.randn(T, H, generator=g).to(device, torch.bfloat16)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(device, torch.bfloat16)
    with torch.no_grad():
        y, r = add_rms_norm(x, delta, w, 1e-6)
        y_ref, r_ref = add_rms_norm_eager(x, delta, w, 1e-6)
    if device == "cuda":
        assert torch.equal(r, r_ref) and _ulps(y, y_ref) <= 2
    else:  # the interpreter truncates r, the normalised row and y: one ulp each
        assert _ulps(r, r_ref) <= 1 and _ulps(y, y_ref) <= 4


# ---------------------------------------------------------------------------------- rope

@pytest.mark.parametrize("heads,D", [(1, 8), (14, 64), (3, 20)])
def test_rope_forward_and_backward_match_eager(device, heads, D):
    T = 9 if device == "cpu" else 16384
    cfg = DecoderConfig(family="qwen2", vocab_size=10, hidden_size=heads * D, intermediate_size=8, num_layers=1,
                        num_heads=heads, num_kv_heads=1, head_dim=D, rope_theta=1e6)
    g = torch.Generator().manual_seed(T + heads + D)
    positions = torch.randint(0, 20000, (T,), generator=g).to(device)
    cos_sin = rope_table(cfg, torch.device(device))[positions]
    cos, sin = cos_sin[:, :1], cos_sin[:, 1:]  # strided views, as the decoder passes them
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x = torch.randn(T, heads, D, generator=g).to(device, dtype)
    (y,), (dx,) = _grads(lambda a: apply_rope(a, cos, sin), [x], seed=heads)
    (y_ref,), (dx_ref,) = _grads(lambda a: apply_rope_eager(a, cos, sin), [x], seed=heads)
    assert y.dtype == dx.dtype == dtype
    (dy,) = _probes([(T, heads, D)], device, seed=heads)
    for got, ref, src in ((y, y_ref, x), (dx, dx_ref, dy.to(dtype))):
        a1, a2 = src.float().chunk(2, dim=-1)
        terms = a1.abs() + a2.abs()  # each output is a sum of one product of either half
        bound = 2 * torch.finfo(dtype).eps * torch.cat((terms, terms), dim=-1) + 1e-30
        assert ((got.float() - ref.float()).abs() <= bound).all()
    if device == "cpu":  # the interpreter does not contract: fp32 results equal bit for bit
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)


def test_rope_takes_q_and_k_as_column_views_of_one_qkv_output(device):
    """q and k of a merged q|k|v GEMM are views with the row stride of the whole output: rotated in
    place of a copy, they give what the contiguous q and k give (values and gradients, bit for bit)."""
    T, Hq, Hkv, D = 7, 4, 2, 16
    cfg = DecoderConfig(family="qwen2", vocab_size=10, hidden_size=Hq * D, intermediate_size=8, num_layers=1,
                        num_heads=Hq, num_kv_heads=Hkv, head_dim=D)
    cos_sin = rope_table(cfg, torch.device(device))[torch.arange(T, device=device) * 3]
    cos, sin = cos_sin[:, :1], cos_sin[:, 1:]
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g).to(device).requires_grad_(True)
    q, k, _ = qkv.split((Hq * D, Hkv * D, Hkv * D), dim=-1)
    views = (q.view(T, Hq, D), k.view(T, Hkv, D))  # (T, heads, D), row stride (Hq + 2 Hkv) D
    assert views[0].stride() == ((Hq + 2 * Hkv) * D, D, 1)
    probes = _probes([(T, Hq, D), (T, Hkv, D)], device, seed=4)
    sum((apply_rope(x, cos, sin) * p).sum() for x, p in zip(views, probes)).backward()
    for x, p in zip(views, probes):
        leaf = x.detach().contiguous().requires_grad_(True)
        y = apply_rope(leaf, cos, sin)
        (y * p).sum().backward()
        assert torch.equal(apply_rope(x, cos, sin), y)
        start = 0 if x.shape[1] == Hq else Hq * D
        assert torch.equal(qkv.grad[:, start:start + x.shape[1] * D], leaf.grad.view(T, -1))
    assert not qkv.grad[:, (Hq + Hkv) * D:].any()  # v's columns: not rotated here


def test_rope_backward_is_the_inverse_rotation(device):
    """dx of sum(rope(x) * dy) is rope(dy) by the angle's negative: rotating back gives dy's rotation."""
    cfg = DecoderConfig(family="llama", vocab_size=10, hidden_size=32, intermediate_size=8, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=16)
    positions = torch.arange(5, device=device) * 7
    cos_sin = rope_table(cfg, torch.device(device))[positions]
    x = torch.randn(5, 2, 16, device=device, requires_grad=True)
    dy = torch.randn(5, 2, 16, device=device)
    (apply_rope(x, cos_sin[:, :1], cos_sin[:, 1:]) * dy).sum().backward()
    back = apply_rope_eager(dy, cos_sin[:, :1], -cos_sin[:, 1:])
    assert torch.allclose(x.grad, back, atol=1e-6)


# ---------------------------------------------------------------------------------- SwiGLU

def _check_swiglu(got, ref, gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> None:
    """got, ref: (y, dg, du) of SwiGLU on gate, up with output gradient dy, within the module's bounds."""
    (y, dg, du), (y_ref, dg_ref, du_ref), dtype = got, ref, gate.dtype
    for a, b in ((y, y_ref), (du, du_ref)):
        assert a.dtype == dtype and _ulps(a, b) <= _max_ulps(dtype)
    # dg = dsilu * sig * (1 + g (1 - sig)), dsilu = dy * u: the last factor cancels near g = -1.28, where
    # fp32 sigmoids one ulp apart differ relatively more, so the bound scales with its terms' size
    sig, dsilu = torch.sigmoid(gate.double()), dy.to(dtype).double() * up.double()
    terms = dsilu.abs() * sig * (1 + (gate.double() * (1 - sig)).abs())
    bound = _max_ulps(dtype) * torch.finfo(dtype).eps * (dg_ref.double().abs() + terms)
    assert dg.dtype == dtype and ((dg.double() - dg_ref.double()).abs() <= bound + 1e-30).all()


def _swiglu_shape(device: str, shape: tuple[int, int]) -> tuple[int, int]:
    return (64, shape[1]) if device == "cpu" and shape[0] > 1000 else shape


@pytest.mark.parametrize("shape", [(1, 5), (7, 300), (16384, 4864)])
def test_silu_mul_forward_and_backward_match_eager(device, shape):
    shape = _swiglu_shape(device, shape)
    g = torch.Generator().manual_seed(shape[1])
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gate = (torch.randn(shape, generator=g) * 4).to(device, dtype)
    up = torch.randn(shape, generator=g).to(device, dtype)
    (y,), (dg, du) = _grads(silu_mul, [gate, up], seed=1)
    (y_ref,), (dg_ref, du_ref) = _grads(silu_mul_eager, [gate, up], seed=1)
    (dy,) = _probes([shape], device, seed=1)
    _check_swiglu((y, dg, du), (y_ref, dg_ref, du_ref), gate, up, dy)


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("shape", [(1, 5), (7, 300), (16384, 4864)])
def test_silu_mul_packed_forward_and_backward_match_eager(device, shape, strided):
    """gate_up = [gate | up], the merged projection's output; strided: a column view of a wider row
    (as in a [T, 2I + 8] buffer), which the kernel reads in place. d(gate_up) is one [T, 2I] tensor."""
    T, I = _swiglu_shape(device, shape)
    g = torch.Generator().manual_seed(T + I + strided)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    rows = torch.zeros(T, 2 * I + (8 if strided else 0), device=device, dtype=dtype)
    rows[:, :I], rows[:, I:2 * I] = torch.randn(T, I, generator=g) * 4, torch.randn(T, I, generator=g)
    (dy,) = _probes([(T, I)], device, seed=2)

    def run(fn):
        leaf = rows.clone().requires_grad_(True)
        y = fn(leaf[:, :2 * I])  # row stride 2I + 8 when strided
        (y.float() * dy).sum().backward()
        assert not leaf.grad[:, 2 * I:].any()
        return y.detach(), leaf.grad[:, :2 * I]

    y, d_gate_up = run(silu_mul_packed)
    y_ref, d_ref = run(silu_mul_packed_eager)
    assert y.shape == (T, I) and y.is_contiguous()
    _check_swiglu((y, *d_gate_up.chunk(2, 1)), (y_ref, *d_ref.chunk(2, 1)), rows[:, :I], rows[:, I:2 * I], dy)


# ---------------------------------------------------------------------------------- inputs and the decoder

def test_empty_inputs(device):
    x, w = torch.empty(0, 8, device=device, requires_grad=True), torch.ones(8, device=device, requires_grad=True)
    y, r = add_rms_norm(x, torch.empty(0, 8, device=device), w, 1e-6)
    (y.sum() + r.sum()).backward()
    assert y.shape == (0, 8) and torch.equal(w.grad, torch.zeros(8, device=device))
    cs = torch.empty(0, 1, 8, device=device)
    assert apply_rope(torch.empty(0, 2, 8, device=device), cs, cs).shape == (0, 2, 8)
    assert silu_mul(torch.empty(0, 3, device=device), torch.empty(0, 3, device=device)).shape == (0, 3)
    assert silu_mul_packed(torch.empty(0, 6, device=device)).shape == (0, 3)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="impl must be one of"):
        rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6, impl="cuda")
    with pytest.raises(ValueError, match=r"weight a contiguous \[H\]"):
        rms_norm(torch.ones(2, 4), torch.ones(3), 1e-6)
    with pytest.raises(ValueError, match="delta must be x's shape"):
        add_rms_norm(torch.ones(2, 4), torch.ones(2, 3), torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="D even"):
        apply_rope(torch.ones(2, 1, 5), torch.ones(2, 1, 5), torch.ones(2, 1, 5))
    with pytest.raises(ValueError, match="must not require one"):
        apply_rope(torch.ones(2, 1, 4), torch.ones(2, 1, 4, requires_grad=True), torch.ones(2, 1, 4))
    with pytest.raises(ValueError, match="one dtype"):
        silu_mul(torch.ones(2, 4), torch.ones(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\[T, 2I\] with a contiguous last dim of even width"):
        silu_mul_packed(torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"got \(2, 3, 4\)"):
        silu_mul_packed(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match=r"strides \(1, 2\)"):
        silu_mul_packed(torch.ones(4, 2).t())
    with pytest.raises(ValueError, match="trunk_kernels must be one of"):
        trunk_ops_for("fused", torch.device("cpu"))


def test_trunk_ops_for_config_names():
    assert trunk_ops_for("auto", torch.device("cpu")) is EAGER_OPS
    assert trunk_ops_for("eager", torch.device("cuda")) is EAGER_OPS
    assert trunk_ops_for("triton", torch.device("cpu")) is TRAIN_OPS
    assert trunk_ops_for("auto", torch.device("cuda")) is TRAIN_OPS


@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize("recompute", [0.0, 1.0])
def test_decoder_trained_through_train_ops_matches_eager(device, recompute, merged):
    """A 2-layer Qwen2-style decoder (biases, GQA, tied head) on a packed row of three sequences, fp32:
    hidden states and the gradient of every parameter, with and without recomputed blocks. merged: the
    TRAIN_OPS decoder runs q/k/v and gate/up as one GEMM each (`weights_cast_once` with merge, its
    copies in fp32 here), so rope takes strided q, k views and SwiGLU the packed gate|up output."""
    cfg = DecoderConfig(family="qwen2", vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e4, qkv_bias=True,
                        tie_embeddings=True, init_std=0.2)
    torch.manual_seed(0)
    eager = Decoder(cfg, device=device, attn_backend="sdpa")
    eager.init_weights()
    with torch.no_grad():  # norms away from 1, so a wrong dw shows
        for name, p in eager.named_parameters():
            if name.endswith("norm"):
                p.add_(0.3 * torch.randn_like(p))
    fused = Decoder(cfg, device=device, attn_backend="sdpa", trunk_ops=TRAIN_OPS)
    fused.load_state_dict(eager.state_dict())
    for m in (eager, fused):
        apply_recompute(m, recompute_count(len(m.blocks), recompute, planned=0))
    lens = [5, 11, 1]
    ids = torch.randint(0, cfg.vocab_size, (sum(lens),), device=device)
    pos = torch.cat([torch.arange(n) for n in lens]).to(device)
    cu = torch.tensor([0] + lens).cumsum(0).to(device, torch.int32)
    probe = torch.randn(sum(lens), cfg.hidden_size, device=device)
    outs = []
    for m in (eager, fused):
        with weights_cast_once([m], torch.float32, merge=True) if merged and m is fused else nullcontext():
            hidden = m(ids, pos, cu, max(lens))
            (hidden * probe).sum().backward()
        outs.append((hidden.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (ref, ref_grads), (got, got_grads) = outs
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert ref_grads.keys() == got_grads.keys()
    for name, g_ref in ref_grads.items():
        g = got_grads[name]
        assert (g - g_ref).abs().max() <= 1e-4 * g_ref.abs().max() + 1e-7, name
