"""The trunk's elementwise ops for training, forward + backward, at Qwen2.5-0.5B shape with 16384
tokens, in the dtypes training uses (fp32 residual and norm weights, bf16 autocast output, bf16
q/k/gate/up), and one whole decoder block forward + backward.

Run: `pytest benchmarks/test_bench_trunk_ops.py --benchmark-only` (CUDA only).
Providers:
  eager          the model's PyTorch ops (`EAGER_OPS`), autograd's backward; the norms' fp32 output
                 cast to bf16 as the next matmul's autocast does
  oreal_fast     `oreal_fast.kernels.trunk_train` (`TRAIN_OPS`): one Triton kernel each way
  torch_compile  torch.compile of the eager code (add_rms_norm and the block only: compiling costs
                 tens of seconds a case)
  liger          liger-kernel's ops where it has them (skipped where it is not installed): its
                 fused add + RMSNorm on bf16 inputs and residual ("llama" casting), SwiGLU, rope on its
                 own [1, heads, T, D] layout (q and k in one call); no block (its rope needs another layout)
Cases: add_rms_norm (x [T, 896] fp32 + delta bf16), rope (q [T, 14, 64] and k [T, 2, 64] bf16),
silu_mul (gate, up [T, 4864] bf16), block (one `Block` with fp32 master weights under bf16 autocast,
varlen attention, 2 sequences of 8192). extra_info: "ms" (median per call), "gb_per_s" (the bytes a
fused forward + backward must move, over the median: reads of the inputs and saved tensors, writes of
outputs and gradients; not for the block) and "peak_extra_gib" (allocated above the inputs).

`test_projections` measures what merged projections and weights cast once per step would save: a
block's q/k/v and gate/up projections, forward + backward from bf16 inputs into fp32 master
gradients, as five GEMMs or as two (q|k|v and gate|up concatenated), with the fp32 masters cast by
autocast in every forward or cast to bf16 once outside the timed region (gradients still reach the
fp32 masters, through the one cast's backward).
"""

from __future__ import annotations

import gc

import pytest
import torch

from rl_shapes import DEVICE, QWEN25_05B

from oreal_fast.kernels.trunk_train import TRAIN_OPS, add_rms_norm, apply_rope, silu_mul
from oreal_fast.model.attention import make_backend
from oreal_fast.model.decoder import EAGER_OPS, Block, rope_table

T = 16384
C = QWEN25_05B
ITERS = 10
# Bytes a fused forward + backward must move. add_rms_norm per element: forward reads x (4), delta (2),
# writes r (4), y (2); backward reads dy (2), dr (4), r (4), writes dx (4), d delta (2). rope: q and k read
# and written once each way, bf16. silu_mul: forward reads g, u, writes the product; backward reads dy, g,
# u, writes dg, du, bf16.
MIN_BYTES = {
    "add_rms_norm": 28 * T * C.hidden_size,
    "rope": 8 * T * (C.num_heads + C.num_kv_heads) * C.head_dim,
    "silu_mul": 16 * T * C.intermediate_size,
}


def _liger():
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError:
        pytest.skip("liger-kernel is not installed")
    return LigerFusedAddRMSNormFunction, LigerRopeFunction, LigerSiLUMulFunction


def _leaf(shape, dtype, scale=1.0):
    return (torch.randn(shape, device=DEVICE) * scale).to(dtype).requires_grad_(True)


def _add_rms_norm(provider: str):
    H = C.hidden_size
    x, delta, w = _leaf((T, H), torch.float32, 2.0), _leaf((T, H), torch.bfloat16), _leaf(H, torch.float32)

    def eager(x, delta, w):
        r = x + delta
        return EAGER_OPS.rms_norm(r, w, C.rms_norm_eps).to(torch.bfloat16), r  # the cast autocast would make

    if provider == "liger":
        fused_add, _, _ = _liger()
        xb, wb = x.detach().bfloat16().requires_grad_(True), w.detach().bfloat16().requires_grad_(True)
        return lambda: fused_add.apply(delta, xb, wb, C.rms_norm_eps), [xb, delta, wb]
    if provider == "oreal_fast":
        def fn():
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                return add_rms_norm(x, delta, w, C.rms_norm_eps)
        return fn, [x, delta, w]
    f = torch.compile(eager) if provider == "torch_compile" else eager
    return lambda: f(x, delta, w), [x, delta, w]


def _rope(provider: str):
    D = C.head_dim
    q, k = _leaf((T, C.num_heads, D), torch.bfloat16), _leaf((T, C.num_kv_heads, D), torch.bfloat16)
    cos_sin = rope_table(C, torch.device(DEVICE))[torch.arange(T, device=DEVICE) % 8192]
    cos, sin = cos_sin[:, :1], cos_sin[:, 1:]
    if provider == "liger":
        _, rope, _ = _liger()
        ql = q.detach().transpose(0, 1)[None].contiguous().requires_grad_(True)  # (1, heads, T, D)
        kl = k.detach().transpose(0, 1)[None].contiguous().requires_grad_(True)
        c2, s2 = cos[:, 0][None].contiguous(), sin[:, 0][None].contiguous()  # (1, T, D)
        return lambda: rope.apply(ql, kl, c2, s2), [ql, kl]
    op = apply_rope if provider == "oreal_fast" else EAGER_OPS.apply_rope
    return lambda: (op(q, cos, sin), op(k, cos, sin)), [q, k]


def _silu_mul(provider: str):
    g, u = _leaf((T, C.intermediate_size), torch.bfloat16, 4.0), _leaf((T, C.intermediate_size), torch.bfloat16)
    if provider == "liger":
        _, _, silu = _liger()
        return lambda: silu.apply(g, u), [g, u]
    op = silu_mul if provider == "oreal_fast" else EAGER_OPS.silu_mul
    return lambda: op(g, u), [g, u]


def _block(provider: str):
    ops = TRAIN_OPS if provider == "oreal_fast" else EAGER_OPS
    block = Block(C, 0, make_backend("varlen"), ops, device=DEVICE, dtype=torch.float32)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    x = _leaf((T, C.hidden_size), torch.float32)
    positions = torch.arange(T, device=DEVICE) % (T // 2)
    cos_sin = rope_table(C, torch.device(DEVICE))[positions]
    cu = torch.tensor([0, T // 2, T], device=DEVICE, dtype=torch.int32)
    f = torch.compile(block) if provider == "torch_compile" else block

    def fn():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            return f(x, cos_sin[:, :1], cos_sin[:, 1:], cu, T // 2, (0, T // 2, T), None)
    return fn, [x, *block.parameters()]


def _time(benchmark, step) -> tuple[float, int]:
    """Median ms per `step` (5 rounds of ITERS after 3 warm-ups: kernels compiled, torch.compile traced,
    allocator primed) and the peak bytes allocated above what existed before the first timed round."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    def timed():
        for _ in range(ITERS):
            step()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=5, iterations=1)
    return benchmark.stats.stats.median / ITERS * 1e3, torch.cuda.max_memory_allocated() - base


CASES = {"add_rms_norm": _add_rms_norm, "rope": _rope, "silu_mul": _silu_mul, "block": _block}
PROVIDERS = ("eager", "oreal_fast", "torch_compile", "liger")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_trunk_op_fwd_bwd(benchmark, provider, case):
    if provider == "torch_compile" and case not in ("add_rms_norm", "block"):
        pytest.skip("compiled only for add_rms_norm and the block (compile time)")
    if provider == "liger" and case == "block":
        pytest.skip("liger's rope takes a [batch, heads, T, D] layout, not the packed block's")
    gc.collect()
    torch.cuda.empty_cache()
    fn, leaves = CASES[case](provider)
    outs = fn()
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]  # the output gradients, made once
    del outs

    def step():
        outs = fn()
        torch.autograd.backward(outs if isinstance(outs, tuple) else (outs,), grads)
        for t in leaves:
            t.grad = None

    ms, peak_extra = _time(benchmark, step)
    benchmark.extra_info.update(ms=ms, peak_extra_gib=peak_extra / 2**30)
    if case in MIN_BYTES:
        benchmark.extra_info["gb_per_s"] = MIN_BYTES[case] / (ms * 1e-3) / 1e9


PROJECTIONS = ("separate_autocast", "merged_autocast", "separate_cast_once", "merged_cast_once")


def _projection_weights(merged: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """fp32 masters (weight, bias) of q, k, v, gate, up, or of q|k|v and gate|up."""
    H, I, D = C.hidden_size, C.intermediate_size, C.head_dim
    outs = [C.num_heads * D, C.num_kv_heads * D, C.num_kv_heads * D]
    if merged:
        return [(_leaf((sum(outs), H), torch.float32, 0.02), _leaf(sum(outs), torch.float32)),
                (_leaf((2 * I, H), torch.float32, 0.02), None)]
    return [(_leaf((n, H), torch.float32, 0.02), _leaf(n, torch.float32)) for n in outs] + \
        [(_leaf((I, H), torch.float32, 0.02), None) for _ in range(2)]


@pytest.mark.parametrize("provider", PROJECTIONS)
def test_projections(benchmark, provider):
    gc.collect()
    torch.cuda.empty_cache()
    masters = _projection_weights(merged=provider.startswith("merged"))
    leaves = [t for pair in masters for t in pair if t is not None]
    cast_once = provider.endswith("cast_once")
    used = [(w.bfloat16(), None if b is None else b.bfloat16()) for w, b in masters] if cast_once else masters
    x = _leaf((T, C.hidden_size), torch.bfloat16)
    outs = [torch.nn.functional.linear(x, w.bfloat16()) for w, _ in used]
    grads = [torch.randn_like(o) for o in outs]
    del outs

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=not cast_once):
            outs = [torch.nn.functional.linear(x, w, b) for w, b in used]
        torch.autograd.backward(outs, grads)  # the one cast keeps no tensor: its graph serves every step
        x.grad = None

    benchmark.extra_info["ms"] = _time(benchmark, step)[0]
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in leaves)
