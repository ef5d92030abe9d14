"""The decoder trunk's elementwise ops for training, forward and backward in Triton: RMSNorm (alone
and with the residual add before it), rotary embedding and the SwiGLU activation (on separate gate
and up, or on the packed output of one gate|up GEMM).

The math, as the eager code these replace (`oreal_fast.model.decoder`, transformers' Llama/Qwen2
op for op):

    rms_norm(x, w, eps)            = w * (x32 * rsqrt(mean(x32^2, -1) + eps)).to(x.dtype),  x32 = x.float()
    add_rms_norm(x, delta, w, eps) = (rms_norm(r, w, eps), r),  r = x + delta
    apply_rope(x, cos, sin)        = x * cos + cat(-x2, x1) * sin,  x = [x1 | x2] on the last dim,
                                     cos and sin cast to x's dtype first
    silu_mul(g, u)                 = silu(g) * u
    silu_mul_packed(gu)            = silu_mul(g, u),  gu = [g | u] on the last dim ([T, 2I] -> [T, I])

and their gradients, as autograd derives them from that code:

    RMSNorm    n = x32 * rstd;  dn = dy * w;  dx = rstd * (dn - n * mean(dn * n, -1)) (+ the residual's
               own gradient dr when the add is fused);  dw = sum over rows of dy * n.to(x.dtype)
    rope       a rotation by -theta: dx1 = dy1 * cos + dy2 * sin,  dx2 = dy2 * cos - dy1 * sin
    SwiGLU     du = dy * silu(g);  dg = dy * u * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
               (packed: d(gu) = [dg | du], written as one [T, 2I] tensor, so no cat follows)

Every kernel loads in fp32 and rounds where the eager ops round in the activation dtype (a product,
silu's output, the normalised row before the weight), so in fp32 the results equal the eager ones
up to fp32 summation order. dw is accumulated in fp32: each program of the backward sums its rows
into one fp32 [H] row of a [programs, H] buffer, and one torch sum over the programs finishes it.

Under autocast the two norms store their output directly in the autocast dtype: that output only
feeds a matmul (the q/k/v and gate/up projections, the heads), which autocast would cast to that
dtype anyway, so the values are the eager ones and the cast kernel and the fp32 copy are gone.

Saved for backward (per token): RMSNorm its input row (the residual sum when fused, which is also
an output, so nothing new) and one fp32 rstd; rope nothing but the shared cos/sin rows; SwiGLU g and
u only (packed: gu, the same bytes; eager also keeps silu(g), another [T, I]). Budget: each forward
reads its inputs once and writes its outputs once; each backward reads the saved rows and dy once
and writes the input gradients once (RMSNorm also writes [programs, H] fp32 partial dw). No host
sync anywhere, no workspace bigger than the partial dw.

Limits: the last dim of every input must be contiguous, rows may be strided (rope takes q and k as
column views of one q|k|v GEMM's output without a copy); H <= 16384 (one row in one block); cos and
sin are tables, not trained (an input that requires grad is an error). On CPU the Triton path runs
only under TRITON_INTERPRET=1. `TRAIN_OPS` bundles the five ops as the trained models' `TrunkOps`
(`trunk_ops_for` picks them or the eager ones from the config's `trunk_kernels`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oreal_fast.model import decoder as model

IMPLS = ("triton", "eager")
TRUNK_KERNELS = ("auto", "triton", "eager")
_MAX_H = 16384
# Elements one program of the row kernels holds at once (rows x next_power_of_2(H)).
_ROW_TILE = 4096
_ROPE_TILE = 2048
_SILU_BLOCK = 2048
# Columns one program of the packed SwiGLU covers (I = 4864 at 0.5B: five programs a row block).
_SILU_PACKED_COLS = 1024
# RMSNorm backward programs per multiprocessor: each sums its rows' dw in registers.
_BWD_PROGRAMS_PER_SM = 4
_INTERPRETER_BWD_PROGRAMS = 3


# ---------------------------------------------------------------------------------- RMSNorm

@triton.jit
def _rms_norm_fwd_kernel(X_ptr, Delta_ptr, W_ptr, Y_ptr, R_ptr, Rstd_ptr, T, H,
                         stride_x, stride_delta, stride_y, stride_r, eps,
                         HAS_DELTA: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    row_ids = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H)
    row_ok = row_ids < T
    mask = row_ok[:, None] & (cols < H)[None, :]
    rows = row_ids.to(tl.int64)[:, None]  # T * stride may pass 2^31
    x = tl.load(X_ptr + rows * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x += tl.load(Delta_ptr + rows * stride_delta + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = x.to(R_ptr.dtype.element_ty)  # eager's x + delta is a tensor of the residual dtype
        tl.store(R_ptr + rows * stride_r + cols[None, :], x, mask=mask)
        x = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    tl.store(Rstd_ptr + row_ids, rstd, mask=row_ok)
    # eager rounds the normalised row to the input dtype before the weight multiplies it
    normed = (x * rstd[:, None]).to(R_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(W_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    tl.store(Y_ptr + rows * stride_y + cols[None, :], (w[None, :] * normed).to(Y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(DY_ptr, DR_ptr, X_ptr, W_ptr, Rstd_ptr, DX_ptr, DDelta_ptr, DW_ptr, T, H,
                         rows_per_program, stride_dy, stride_dr, stride_x, stride_dx, stride_ddelta,
                         HAS_DR: tl.constexpr, STORE_DDELTA: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    w = tl.load(W_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_H,), dtype=tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, T)
    for start in range(first, last, BLOCK_T):
        rows = start + tl.arange(0, BLOCK_T)
        row_ok = rows < last
        mask = row_ok[:, None] & col_ok[None, :]
        r64 = rows.to(tl.int64)[:, None]
        x = tl.load(X_ptr + r64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY_ptr + r64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd_ptr + rows, mask=row_ok, other=0.0)
        n = x * rstd[:, None]
        # dw sees the rounded normalised row (what the forward multiplied); dx the exact one
        dw += tl.sum(dy * n.to(X_ptr.dtype.element_ty).to(tl.float32), axis=0)
        dn = dy * w[None, :]
        dx = rstd[:, None] * (dn - n * (tl.sum(dn * n, axis=1) / H)[:, None])
        if HAS_DR:
            dx += tl.load(DR_ptr + r64 * stride_dr + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX_ptr + r64 * stride_dx + cols[None, :], dx.to(DX_ptr.dtype.element_ty), mask=mask)
        if STORE_DDELTA:  # the add's other input, of another dtype, takes the same gradient
            tl.store(DDelta_ptr + r64 * stride_ddelta + cols[None, :], dx.to(DDelta_ptr.dtype.element_ty),
                     mask=mask)
    tl.store(DW_ptr + pid.to(tl.int64) * H + cols, dw, mask=col_ok)


def _row_blocks(H: int) -> tuple[int, int]:
    block_h = triton.next_power_of_2(H)
    return max(1, _ROW_TILE // block_h), block_h


def _norm_forward(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                  out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (y [T, H] out_dtype, r [T, H] (x + delta, or x itself), rstd [T] fp32)."""
    T, H = x.shape
    y = torch.empty((T, H), dtype=out_dtype, device=x.device)
    r = x if delta is None else torch.empty((T, H), dtype=torch.promote_types(x.dtype, delta.dtype), device=x.device)
    rstd = torch.empty(T, dtype=torch.float32, device=x.device)
    block_t, block_h = _row_blocks(H)
    if T:
        d = x if delta is None else delta
        _rms_norm_fwd_kernel[(triton.cdiv(T, block_t),)](
            x, d, weight, y, r, rstd, T, H, x.stride(0), d.stride(0), y.stride(0), r.stride(0), eps,
            HAS_DELTA=delta is not None, BLOCK_T=block_t, BLOCK_H=block_h, num_warps=4)
    return y, r, rstd


def _norm_programs(T: int, block_t: int, device: torch.device) -> int:
    """Backward programs: a few per multiprocessor (three in the interpreter, to test the dw sum)."""
    if device.type != "cuda":
        per_device = _INTERPRETER_BWD_PROGRAMS
    else:
        per_device = _BWD_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(per_device, triton.cdiv(T, block_t)))


def _norm_backward(dy: torch.Tensor, dr: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor,
                   rstd: torch.Tensor, delta_dtype: torch.dtype | None
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """-> (dx [T, H] x's dtype, d delta in delta_dtype or None when it is dx's, dw [H] weight's dtype)."""
    T, H = x.shape
    dy = dy if dy.stride(-1) == 1 else dy.contiguous()
    if dr is not None and dr.stride(-1) != 1:
        dr = dr.contiguous()
    dx = torch.empty((T, H), dtype=x.dtype, device=x.device)
    store_ddelta = delta_dtype is not None and delta_dtype != x.dtype
    ddelta = torch.empty((T, H), dtype=delta_dtype, device=x.device) if store_ddelta else None
    block_t, block_h = _row_blocks(H)
    programs = _norm_programs(T, block_t, x.device)
    dw_partial = torch.empty((programs, H), dtype=torch.float32, device=x.device)
    rows_per_program = triton.cdiv(T, programs) if T else 0
    dd = dx if ddelta is None else ddelta
    _rms_norm_bwd_kernel[(programs,)](
        dy, dy if dr is None else dr, x, weight, rstd, dx, dd, dw_partial, T, H, rows_per_program,
        dy.stride(0), 0 if dr is None else dr.stride(0), x.stride(0), dx.stride(0), dd.stride(0),
        HAS_DR=dr is not None, STORE_DDELTA=store_ddelta, BLOCK_T=block_t, BLOCK_H=block_h, num_warps=4)
    return dx, ddelta, dw_partial.sum(0).to(weight.dtype)


class _RMSNorm(torch.autograd.Function):
    """y = rms_norm(x + delta) and r = x + delta (delta None: y = rms_norm(x), r not returned)."""

    @staticmethod
    def forward(ctx, x, delta, weight, eps, out_dtype):
        y, r, rstd = _norm_forward(x, delta, weight, eps, out_dtype)
        ctx.save_for_backward(r, weight, rstd)
        ctx.delta_dtype = None if delta is None else delta.dtype
        ctx.set_materialize_grads(False)
        return y if delta is None else (y, r)

    @staticmethod
    def backward(ctx, dy, dr=None):
        r, weight, rstd = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros(r.shape, dtype=r.dtype, device=r.device)
        dx, ddelta, dw = _norm_backward(dy, dr, r, weight, rstd, ctx.delta_dtype)
        if ctx.delta_dtype is None:
            return dx, None, dw, None, None
        # x and delta receive the same gradient (the add's); one tensor serves both when dtypes agree
        return dx, dx if ddelta is None else ddelta, dw, None, None


def _norm_out_dtype(device: torch.device, x_dtype: torch.dtype, weight: torch.dtype) -> torch.dtype:
    """The dtype eager's `weight * normed` has, or the autocast dtype its next matmul casts it to."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.promote_types(x_dtype, weight)


def _check_norm(name: str, x: torch.Tensor, weight: torch.Tensor, delta: torch.Tensor | None = None) -> None:
    if x.dim() != 2 or x.stride(1) != 1 or weight.shape != (x.shape[1],) or not weight.is_contiguous():
        raise ValueError(f"{name}: x must be [T, H] with a contiguous last dim and weight a contiguous [H]; got "
                         f"x {tuple(x.shape)} strides {x.stride()}, weight {tuple(weight.shape)}")
    if x.shape[1] > _MAX_H:
        raise ValueError(f"{name}: H = {x.shape[1]} is above the {_MAX_H} one program holds")
    if delta is not None and (delta.shape != x.shape or delta.stride(1) != 1):
        raise ValueError(f"{name}: delta must be x's shape {tuple(x.shape)} with a contiguous last dim; got "
                         f"{tuple(delta.shape)} strides {delta.stride()}")


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments as `rms_norm`): the model's own op."""
    return model.rms_norm(x, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, impl: str = "triton") -> torch.Tensor:
    """RMSNorm over the last dim with fp32 statistics, differentiable in x and weight.

    Args:
        x: [T, H] bf16/fp16/fp32, last dim contiguous.
        weight: [H] contiguous (fp32 masters or the activation dtype).
        eps: added to the mean square.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        [T, H] in the autocast dtype under autocast, else in the promoted dtype of x and weight.
    """
    _check_impl(impl, "rms_norm")
    if impl == "eager":
        return rms_norm_eager(x, weight, eps)
    _check_norm("rms_norm", x, weight)
    return _RMSNorm.apply(x, None, weight, eps, _norm_out_dtype(x.device, x.dtype, weight.dtype))


def add_rms_norm_eager(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, *,
                       impl: str = "eager") -> tuple[torch.Tensor, torch.Tensor]:
    """The eager twin (same arguments as `add_rms_norm`): the residual add, then the model's RMSNorm."""
    r = x + delta
    return model.rms_norm(r, weight, eps), r


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 impl: str = "triton") -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm of its result in one pass, differentiable in all three tensors.

    Args:
        x: [T, H] the residual stream, last dim contiguous (fp32 for fp32 masters under autocast).
        delta: [T, H] the branch output added to it (may be another dtype, e.g. bf16).
        weight: [H] contiguous.
        eps: added to the mean square.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        (normed [T, H] in `rms_norm`'s output dtype, r = x + delta [T, H] in their promoted dtype).
    """
    _check_impl(impl, "add_rms_norm")
    if impl == "eager":
        return add_rms_norm_eager(x, delta, weight, eps)
    _check_norm("add_rms_norm", x, weight, delta)
    r_dtype = torch.promote_types(x.dtype, delta.dtype)
    return _RMSNorm.apply(x, delta, weight, eps, _norm_out_dtype(x.device, r_dtype, weight.dtype))


# ---------------------------------------------------------------------------------- rope

@triton.jit
def _rope_kernel(X_ptr, Cos_ptr, Sin_ptr, Out_ptr, R, heads, stride_xt, stride_xh, stride_ct, stride_st,
                 INVERSE: tl.constexpr, HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # one row per (token, head): row = t * heads + h
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = (rows // heads).to(tl.int64)[:, None]
    h = (rows % heads).to(tl.int64)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    in_d = d < HALF
    mask = (rows < R)[:, None] & in_d
    dtype = Out_ptr.dtype.element_ty
    # the tables are fp32; eager casts them to the activation dtype before multiplying
    cos1 = tl.load(Cos_ptr + t * stride_ct + d, mask=mask, other=0.0).to(dtype).to(tl.float32)
    cos2 = tl.load(Cos_ptr + t * stride_ct + HALF + d, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin1 = tl.load(Sin_ptr + t * stride_st + d, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin2 = tl.load(Sin_ptr + t * stride_st + HALF + d, mask=mask, other=0.0).to(dtype).to(tl.float32)
    src = X_ptr + t * stride_xt + h * stride_xh
    x1 = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + d, mask=mask, other=0.0).to(tl.float32)
    # each product rounded, then the sum, as eager's bf16 ops (and autograd's for the backward) round
    if INVERSE:  # the transpose of the rotation: the gradient
        out1 = (x1 * cos1).to(dtype).to(tl.float32) + (x2 * sin2).to(dtype).to(tl.float32)
        out2 = (x2 * cos2).to(dtype).to(tl.float32) - (x1 * sin1).to(dtype).to(tl.float32)
    else:
        out1 = (x1 * cos1).to(dtype).to(tl.float32) - (x2 * sin1).to(dtype).to(tl.float32)
        out2 = (x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)
    dst = Out_ptr + (t * heads + h) * (2 * HALF)
    tl.store(dst + d, out1.to(dtype), mask=mask)
    tl.store(dst + HALF + d, out2.to(dtype), mask=mask)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    T, heads, D = x.shape
    x = x if x.stride(2) == 1 else x.contiguous()
    out = torch.empty((T, heads, D), dtype=x.dtype, device=x.device)
    R = T * heads
    block_d = triton.next_power_of_2(D // 2)
    block_r = max(1, _ROPE_TILE // block_d)
    if R:
        _rope_kernel[(triton.cdiv(R, block_r),)](
            x, cos, sin, out, R, heads, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
            INVERSE=inverse, HALF=D // 2, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4)
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin, inverse=False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _rope(dy, cos, sin, inverse=True), None, None


def apply_rope_eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments as `apply_rope`): the model's own op."""
    return model.apply_rope(x, cos, sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """Rotate x by the half-split convention of HF Llama checkpoints, differentiable in x.

    Args:
        x: [T, heads, D] bf16/fp16/fp32, last dim contiguous, D even.
        cos, sin: [T, 1, D] fp32 rows of the rope table (strided views are fine: last dim contiguous);
            tables, not trained.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        [T, heads, D] contiguous, in x's dtype.
    """
    _check_impl(impl, "apply_rope")
    if impl == "eager":
        return apply_rope_eager(x, cos, sin)
    T, heads, D = x.shape
    if D % 2 or cos.shape != (T, 1, D) or sin.shape != (T, 1, D) or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError(f"apply_rope: needs x [T, heads, D] with D even and cos, sin [T, 1, D] with a contiguous "
                         f"last dim; got x {tuple(x.shape)}, cos {tuple(cos.shape)} strides {cos.stride()}, "
                         f"sin {tuple(sin.shape)} strides {sin.stride()}")
    if cos.requires_grad or sin.requires_grad:
        raise ValueError("apply_rope: cos and sin are rope tables; this op gives them no gradient, "
                         "so they must not require one")
    return _Rope.apply(x, cos, sin)


# ---------------------------------------------------------------------------------- SwiGLU

@triton.jit
def _silu_mul_value(g, u, dtype: tl.constexpr):
    """silu(g) * u in fp32 from fp32 g, u, silu's output rounded to ``dtype`` as eager rounds it."""
    return (g * tl.sigmoid(g)).to(dtype).to(tl.float32) * u


@triton.jit
def _silu_mul_grads(dy, g, u, dtype: tl.constexpr):
    """(dg, du) in fp32 from fp32 dy, g, u, rounded to ``dtype`` where autograd's ops round."""
    sig = tl.sigmoid(g)
    silu = (g * sig).to(dtype).to(tl.float32)  # recomputed, as the forward rounded it
    dsilu = (dy * u).to(dtype).to(tl.float32)  # the product's gradient, rounded as autograd's mul
    return dsilu * sig * (1.0 + g * (1.0 - sig)), dy * silu


@triton.jit
def _silu_mul_fwd_kernel(G_ptr, U_ptr, Out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    dtype = Out_ptr.dtype.element_ty
    g = tl.load(G_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out_ptr + offs, _silu_mul_value(g, u, dtype).to(dtype), mask=mask)


@triton.jit
def _silu_mul_bwd_kernel(DY_ptr, G_ptr, U_ptr, DG_ptr, DU_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    dtype = DG_ptr.dtype.element_ty
    dy = tl.load(DY_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dg, du = _silu_mul_grads(dy, g, u, dtype)
    tl.store(DU_ptr + offs, du.to(dtype), mask=mask)
    tl.store(DG_ptr + offs, dg.to(dtype), mask=mask)


@triton.jit
def _silu_mul_packed_fwd_kernel(GU_ptr, Out_ptr, T, I, stride_gu, stride_out,
                                BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = (tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I))[None, :]
    mask = (rows < T)[:, None] & (cols < I)
    r64 = rows.to(tl.int64)[:, None]  # T * stride may pass 2^31
    dtype = Out_ptr.dtype.element_ty
    gate = GU_ptr + r64 * stride_gu + cols  # row t holds gate in columns [0, I), up in [I, 2I)
    g = tl.load(gate, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate + I, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out_ptr + r64 * stride_out + cols, _silu_mul_value(g, u, dtype).to(dtype), mask=mask)


@triton.jit
def _silu_mul_packed_bwd_kernel(DY_ptr, GU_ptr, DGU_ptr, T, I, stride_dy, stride_gu, stride_dgu,
                                BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = (tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I))[None, :]
    mask = (rows < T)[:, None] & (cols < I)
    r64 = rows.to(tl.int64)[:, None]
    dtype = DGU_ptr.dtype.element_ty
    dy = tl.load(DY_ptr + r64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    gate = GU_ptr + r64 * stride_gu + cols
    g = tl.load(gate, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate + I, mask=mask, other=0.0).to(tl.float32)
    dg, du = _silu_mul_grads(dy, g, u, dtype)
    d_gate = DGU_ptr + r64 * stride_dgu + cols  # d(gate_up) in the layout of gate_up: no cat after
    tl.store(d_gate, dg.to(dtype), mask=mask)
    tl.store(d_gate + I, du.to(dtype), mask=mask)


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        out = torch.empty_like(gate)
        N = gate.numel()
        if N:
            _silu_mul_fwd_kernel[(triton.cdiv(N, _SILU_BLOCK),)](gate, up, out, N, BLOCK=_SILU_BLOCK, num_warps=8)
        return out

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dy = dy.contiguous()
        dg, du = torch.empty_like(gate), torch.empty_like(up)
        N = gate.numel()
        if N:
            _silu_mul_bwd_kernel[(triton.cdiv(N, _SILU_BLOCK),)](dy, gate, up, dg, du, N, BLOCK=_SILU_BLOCK,
                                                                 num_warps=8)
        return dg, du


def silu_mul_eager(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments as `silu_mul`): the model's own op."""
    return model.silu_mul(gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """silu(gate) * up, elementwise, differentiable in both; saves only gate and up for backward.

    Args:
        gate, up: the same shape and dtype, contiguous.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        a tensor of their shape and dtype.
    """
    _check_impl(impl, "silu_mul")
    if impl == "eager":
        return silu_mul_eager(gate, up)
    if gate.shape != up.shape or gate.dtype != up.dtype or not (gate.is_contiguous() and up.is_contiguous()):
        raise ValueError(f"silu_mul: gate and up must be contiguous, of one shape and one dtype; got "
                         f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}")
    return _SiluMul.apply(gate, up)


def _packed_blocks(I: int) -> tuple[int, int]:
    block_i = min(triton.next_power_of_2(I), _SILU_PACKED_COLS)
    return max(1, _SILU_BLOCK // block_i), block_i


class _SiluMulPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        T, I = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
        block_t, block_i = _packed_blocks(I)
        if T and I:
            _silu_mul_packed_fwd_kernel[(triton.cdiv(T, block_t), triton.cdiv(I, block_i))](
                gate_up, out, T, I, gate_up.stride(0), out.stride(0), BLOCK_T=block_t, BLOCK_I=block_i,
                num_warps=8)
        return out

    @staticmethod
    def backward(ctx, dy):
        (gate_up,) = ctx.saved_tensors
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        T, I = dy.shape
        d_gate_up = torch.empty((T, 2 * I), dtype=gate_up.dtype, device=gate_up.device)
        block_t, block_i = _packed_blocks(I)
        if T and I:
            _silu_mul_packed_bwd_kernel[(triton.cdiv(T, block_t), triton.cdiv(I, block_i))](
                dy, gate_up, d_gate_up, T, I, dy.stride(0), gate_up.stride(0), d_gate_up.stride(0),
                BLOCK_T=block_t, BLOCK_I=block_i, num_warps=8)
        return d_gate_up


def silu_mul_packed_eager(gate_up: torch.Tensor, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments as `silu_mul_packed`): the model's own op."""
    return model.silu_mul_packed(gate_up)


def silu_mul_packed(gate_up: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """silu(gate) * up on the output of one gate|up GEMM, differentiable; saves only gate_up, and its
    backward writes d(gate_up) [T, 2I] directly (no cat of dgate and dup).

    Args:
        gate_up: [T, 2I] bf16/fp16/fp32 = [gate | up] on the last dim, last dim contiguous (a row
            stride above 2I is fine).
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        [T, I] contiguous, in gate_up's dtype.
    """
    _check_impl(impl, "silu_mul_packed")
    if impl == "eager":
        return silu_mul_packed_eager(gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"silu_mul_packed: gate_up must be [T, 2I] with a contiguous last dim of even width; "
                         f"got {tuple(gate_up.shape)} strides {gate_up.stride()}")
    return _SiluMulPacked.apply(gate_up)


def _check_impl(impl: str, name: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"{name}: impl must be one of {IMPLS}, got {impl!r}")


# The trained models' trunk on CUDA: one Triton kernel per op and per backward.
TRAIN_OPS = model.TrunkOps(rms_norm, apply_rope, silu_mul, silu_mul_packed, add_rms_norm)


def trunk_ops_for(trunk_kernels: str, device: torch.device) -> model.TrunkOps:
    """The config's ``trunk_kernels``: "auto" is `TRAIN_OPS` on CUDA and the eager ops elsewhere."""
    if trunk_kernels not in TRUNK_KERNELS:
        raise ValueError(f"trunk_kernels must be one of {TRUNK_KERNELS}, got {trunk_kernels!r}")
    if trunk_kernels == "auto":
        trunk_kernels = "triton" if device.type == "cuda" else "eager"
    return TRAIN_OPS if trunk_kernels == "triton" else model.EAGER_OPS
