"""The decoder trunk's elementwise ops for inference, one Triton kernel each: RMSNorm (with the
residual add before it), rotary embedding (alone, or on a packed q|k|v row with the KV-cache
write) and the SwiGLU activation.

Eager, each of these is a chain of small kernels (residual add; RMSNorm: cast, square, mean, add,
rsqrt, multiply, cast, multiply; rope: table gather, two table casts, negate, concatenate, two
multiplies, add, per q and k; K/V cache write: two index copies; SwiGLU: silu, multiply), about 35
per layer. In a decode step of a 0.5B model each of them moves a few hundred KB at most and costs
a launch-sized slot of GPU time (~2-3 us on an H200), so together they take more GPU time than the
layer's matmuls. Here each op is one pass over its rows.

The math, as the eager twins compute it (transformers' Llama/Qwen2 op for op, every
intermediate rounded to the activation dtype where transformers rounds it):

    rms_norm(x, w, eps)          = w * (x32 * rsqrt(mean(x32^2, -1) + eps)).to(dtype),  x32 = x.float()
    add_rms_norm(x, r, w, eps)   = (rms_norm(r + x, w, eps), r + x)     # r + x rounded to dtype, as
                                   # the eager residual add `x = x + attn_out` rounds it; r None: (rms_norm(x), x)
    apply_rope(x, cos, sin)      = x * cos + cat(-x2, x1) * sin,   x = [x1 | x2] on the last dim,
                                   cos and sin cast to x's dtype first
    rope_write_kv(qkv, positions, rope, k_cache, v_cache, slots):
        q, k, v = qkv.split([Hq D, Hkv D, Hkv D], -1)                  # one GEMM's output row
        cos, sin = rope[positions, 0], rope[positions, 1]
        k_cache.view(-1, Hkv, D)[slots] = apply_rope(k, cos, sin)      # slot = block * block_size + offset
        v_cache.view(-1, Hkv, D)[slots] = v
        return apply_rope(q, cos, sin)                                 # [T, Hq, D]
    silu_mul(g, u)               = silu(g) * u    (g, u may be the two halves of one gate|up row)

The kernels load in fp32, round where the eager ops round, and store in the input dtype, so they
equal the twins up to the fp32 rounding of the RMSNorm sum and of exp, and (rope, on the GPU) a
product and sum the compiler contracts into one fused multiply-add: one bf16 ulp here and there.
The residual sum is exact to the twin: fp32 sum of two dtype values, rounded once.

Budget: one read of each input and one write of each output; no workspace; no host sync, so a
CUDA graph captures them. RMSNorm: one program per row (H <= 16384 in one block), the residual
read and written in the same pass. Rope: one program per token, all its heads (rope_write_kv:
the q, k and v heads of the token; it reads 2 D fp32 of the table at the token's position).
SwiGLU: programs of 1024 elements of one row.

Limits: rope_write_kv does not check that positions are inside the table or slots inside the
pool (a check would be a device-side assert, i.e. extra kernels on the decode hot path): the
caller guarantees them, as the eager twin's indexing would fail otherwise. Several tokens may
name one slot (a CUDA graph's padding rows all write the null block's slot 0); which of them
lands is unspecified.

Forward only, no autograd: the rollout engine's copy uses them (`oreal_fast.rollout.engine.
inference_model`). The trained models take the differentiable ones of `trunk_train` (`TRAIN_OPS`),
which a `Decoder` that does not train can use too. The twins here are the eager ops of
`oreal_fast.model.decoder` with the kernels' signature.
On CPU the Triton path runs only under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oreal_fast.kernels.common import check_pdl, gdc_launch_dependents, gdc_wait, pdl_launch
from oreal_fast.model import decoder as model

IMPLS = ("triton", "eager")
_SILU_BLOCK = 1024


# ------------------------------------------------------------- the math the kernels share
# (here and in `decode_gemv`, whose fused layers must round exactly as these ops do)

@triton.jit
def rms_norm_rounded(x, w, H, eps, dtype: tl.constexpr, AXIS: tl.constexpr):
    """w * rms_norm(x) along AXIS, in fp32, from fp32 x holding dtype values and the fp32 weight: the
    normalised row is rounded to dtype before the weight multiplies it, as eager rounds it (the
    caller rounds the product)."""
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, AXIS, keep_dims=True) / H + eps)
    return w * (x * rstd).to(dtype).to(tl.float32)


@triton.jit
def silu_mul_rounded(g, u, dtype: tl.constexpr):
    """silu(g) * u in fp32 from fp32 g and u: silu's output rounded to dtype first, as eager rounds it
    (the caller rounds the product)."""
    return (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32) * u


@triton.jit
def rope_rounded(x1, x2, cos1, cos2, sin1, sin2, dtype: tl.constexpr):
    """Rope of the halves x1, x2 of heads (fp32 holding dtype values) from the fp32 table's cos
    and sin at their columns -> (out1, out2) in fp32: the table cast to dtype first, each product
    rounded, then the sum, as three eager ops in the activation dtype round (the caller rounds
    the sums)."""
    cos1, cos2 = cos1.to(dtype).to(tl.float32), cos2.to(dtype).to(tl.float32)
    sin1, sin2 = sin1.to(dtype).to(tl.float32), sin2.to(dtype).to(tl.float32)
    out1 = (x1 * cos1).to(dtype).to(tl.float32) + (-x2 * sin1).to(dtype).to(tl.float32)
    out2 = (x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)
    return out1, out2


# ---------------------------------------------------------------------------------- RMSNorm

@triton.jit
def _add_rms_norm_kernel(X_ptr, R_ptr, W_ptr, Out_ptr, ROut_ptr, H, stride_x, stride_r, stride_out, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    dtype = Out_ptr.dtype.element_ty
    x = tl.load(X_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        # the residual stream lives in the activation dtype: the sum is rounded before the norm reads it
        x = (r + x).to(dtype)
        tl.store(ROut_ptr + row * H + offs, x, mask=mask)
        x = x.to(tl.float32)
    w = tl.load(W_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out_ptr + row * stride_out + offs, rms_norm_rounded(x, w, H, eps, dtype, 0).to(dtype), mask=mask)


def _check_norm(name: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(1) != 1 or weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
        raise ValueError(f"{name}: x must be [T, H] with a contiguous last dim and weight [H] of x's dtype; got "
                         f"x {tuple(x.shape)} {x.dtype} strides {x.stride()}, weight {tuple(weight.shape)} "
                         f"{weight.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(1) != 1):
        raise ValueError(f"{name}: residual must be [T, H] = {tuple(x.shape)} in {x.dtype} with a contiguous "
                         f"last dim; got {tuple(residual.shape)} {residual.dtype} strides {residual.stride()}")


def _launch_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    T, H = x.shape
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    r_out = x if residual is None else torch.empty((T, H), dtype=x.dtype, device=x.device)
    if T:
        r = x if residual is None else residual  # a placeholder pointer without a residual
        _add_rms_norm_kernel[(T,)](x, r, weight, out, r_out, H, x.stride(0), r.stride(0), out.stride(0), eps,
                                   HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(H),
                                   num_warps=4)
    return out, r_out


def add_rms_norm_eager(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                       *, impl: str = "eager") -> tuple[torch.Tensor, torch.Tensor]:
    """The eager twin (same arguments and results as `add_rms_norm`): the decoder's residual add,
    then its RMSNorm."""
    if residual is not None:
        x = residual + x
    return model.rms_norm(x, weight, eps), x


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 *, impl: str = "triton") -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it, in one pass: the updated residual stream and its norm.

    Args:
        x: [T, H] bf16/fp16/fp32, last dim contiguous: a sublayer's output (or the embeddings).
        residual: [T, H] in x's dtype, last dim contiguous, or None (the first norm of the first
            layer: nothing to add).
        weight: [H], x's dtype.
        eps: added to the mean square.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        normed: [T, H] rms_norm(residual + x), contiguous.
        residual: [T, H] residual + x rounded to x's dtype, contiguous (x itself when residual is None).
    """
    _check_impl(impl, "add_rms_norm")
    if impl == "eager":
        return add_rms_norm_eager(x, residual, weight, eps)
    _check_norm("add_rms_norm", x, residual, weight)
    return _launch_norm(x, residual, weight, eps)


# ---------------------------------------------------------------------------------- rope

@triton.jit
def _rope_heads(Src_ptr, Dst_ptr, Cos_ptr, Sin_ptr, d, mask, HALF: tl.constexpr):
    """Rope of a token's heads at Src_ptr (+ d on the last dim, [heads, BLOCK_D] tiles), stored
    at Dst_ptr in the same layout; Cos_ptr, Sin_ptr: the token's fp32 table rows."""
    dtype = Dst_ptr.dtype.element_ty
    in_d = d < HALF
    cos1 = tl.load(Cos_ptr + d, mask=in_d, other=0.0)
    cos2 = tl.load(Cos_ptr + HALF + d, mask=in_d, other=0.0)
    sin1 = tl.load(Sin_ptr + d, mask=in_d, other=0.0)
    sin2 = tl.load(Sin_ptr + HALF + d, mask=in_d, other=0.0)
    x1 = tl.load(Src_ptr + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(Src_ptr + HALF + d, mask=mask, other=0.0).to(tl.float32)
    out1, out2 = rope_rounded(x1, x2, cos1, cos2, sin1, sin2, dtype)
    tl.store(Dst_ptr + d, out1.to(dtype), mask=mask)
    tl.store(Dst_ptr + HALF + d, out2.to(dtype), mask=mask)


@triton.jit
def _rope_write_kv_kernel(QKV_ptr, Pos_ptr, Rope_ptr, Slot_ptr, Q_ptr, K_ptr, V_ptr,
                          stride_qkv, stride_rope_pos, stride_rope_cs, stride_k_slot, stride_k_head,
                          stride_v_slot, stride_v_head,
                          HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                          BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_D: tl.constexpr,
                          PDL: tl.constexpr):
    if PDL:  # everything it reads but the rope table is a previous kernel's: only the launch overlaps
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos_ptr + t).to(tl.int64)
    # int64: slot * stride exceeds int32 in a pool of more than 2^31 elements
    slot = tl.load(Slot_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    cos_row = Rope_ptr + pos * stride_rope_pos
    sin_row = cos_row + stride_rope_cs
    row = QKV_ptr + t * stride_qkv  # [q heads | k heads | v heads], each head 2 * HALF wide
    hq = tl.arange(0, BLOCK_HQ)[:, None]
    _rope_heads(row + hq * 2 * HALF, Q_ptr + (t * HQ + hq) * 2 * HALF, cos_row, sin_row, d,
                (hq < HQ) & (d < HALF), HALF)
    hk = tl.arange(0, BLOCK_HKV)[:, None]
    _rope_heads(row + (HQ + hk) * 2 * HALF, K_ptr + slot * stride_k_slot + hk * stride_k_head, cos_row, sin_row,
                d, (hk < HKV) & (d < HALF), HALF)
    dv = tl.arange(0, 2 * BLOCK_D)[None, :]
    v_mask = (hk < HKV) & (dv < 2 * HALF)
    v = tl.load(row + (HQ + HKV + hk) * 2 * HALF + dv, mask=v_mask, other=0.0)
    tl.store(V_ptr + slot * stride_v_slot + hk * stride_v_head + dv, v, mask=v_mask)


def check_kv_pool(name: str, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int]:
    """One layer's pools for a rope and K/V write: one [num_blocks, block_size, Hkv, D] shape with
    an even D, contiguous last dims, blocks back to back; returns (Hkv, D)."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[3] % 2:
        raise ValueError(f"{name}: k_cache and v_cache must share one [num_blocks, block_size, Hkv, D] "
                         f"shape with an even D; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    _, block_size, Hkv, D = k_cache.shape
    for pool, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        # slots index blocks and offsets as one flat dim: block rows must follow each other
        if c.stride(3) != 1 or c.stride(0) != block_size * c.stride(1):
            raise ValueError(f"{name}: {pool} must have a contiguous last dim and blocks of "
                             f"block_size slots back to back; got strides {c.stride()}")
    return Hkv, D


def check_rope_slots(name: str, T: int, D: int, positions: torch.Tensor, rope: torch.Tensor,
                     slots: torch.Tensor) -> None:
    """positions and slots [T] int64, rope the [P, 2, D] fp32 table (`decoder.rope_table`)."""
    for arg, t in (("positions", positions), ("slots", slots)):
        if t.shape != (T,) or t.dtype != torch.int64:
            raise ValueError(f"{name}: {arg} must be [T={T}] int64; got {tuple(t.shape)} {t.dtype}")
    if rope.dim() != 3 or rope.shape[1:] != (2, D) or rope.dtype != torch.float32 or rope.stride(2) != 1:
        raise ValueError(f"{name}: rope must be the [P, 2, D={D}] fp32 table with a contiguous last dim; "
                         f"got {tuple(rope.shape)} {rope.dtype}")


def _check_rope_write_kv(qkv: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, slots: torch.Tensor) -> int:
    """Validates the arguments of `rope_write_kv`; returns the number of query heads."""
    Hkv, D = check_kv_pool("rope_write_kv", k_cache, v_cache)
    width = qkv.shape[-1] if qkv.dim() == 2 else -1
    if qkv.dim() != 2 or qkv.stride(1) != 1 or width % D or width // D <= 2 * Hkv:
        raise ValueError(f"rope_write_kv: qkv must be [T, (Hq + 2 Hkv) D] with Hq >= 1, Hkv = {Hkv}, "
                         f"D = {D} and a contiguous last dim; got {tuple(qkv.shape)} strides {qkv.stride()}")
    if not qkv.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError(f"rope_write_kv: the KV pool holds {k_cache.dtype} / {v_cache.dtype} but qkv is {qkv.dtype}")
    check_rope_slots("rope_write_kv", qkv.shape[0], D, positions, rope, slots)
    if len({t.device for t in (qkv, positions, rope, k_cache, v_cache, slots)}) != 1:
        raise ValueError("rope_write_kv: all inputs must be on one device")
    return width // D - 2 * Hkv


def rope_write_kv_eager(qkv: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, slots: torch.Tensor, *, pdl: bool = False,
                        impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments, writes and result as `rope_write_kv`): the model's rope on
    the split q, k, v, and two index copies into the pool (``pdl``, a launch option, changes nothing)."""
    Hq = _check_rope_write_kv(qkv, positions, rope, k_cache, v_cache, slots)
    T, (_, _, Hkv, D) = qkv.shape[0], k_cache.shape
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    cos_sin = rope[positions]  # (T, 2, D) fp32
    cos, sin = cos_sin[:, :1], cos_sin[:, 1:]  # (T, 1, D) each
    k_cache.view(-1, Hkv, D).index_copy_(0, slots, model.apply_rope(k.view(T, Hkv, D), cos, sin))
    v_cache.view(-1, Hkv, D).index_copy_(0, slots, v.view(T, Hkv, D))
    return model.apply_rope(q.view(T, Hq, D), cos, sin)


def rope_write_kv(qkv: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slots: torch.Tensor, *, pdl: bool = False, impl: str = "triton") -> torch.Tensor:
    """Rope q and k of a packed q|k|v projection, write k and v into a paged KV pool, return q.

    Args:
        qkv: [T, (Hq + 2 Hkv) D] bf16/fp16/fp32, last dim contiguous: per token its Hq query
            heads, then Hkv key heads, then Hkv value heads, un-roped (one GEMM's output).
        positions: [T] int64, each token's position, in [0, P).
        rope: [P, 2, D] fp32 cos and sin per position (`decoder.rope_table`).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D] in qkv's dtype: one layer's pools,
            written in place at the slots.
        slots: [T] int64 pool slot (block * block_size + offset) of each token, in range.
        pdl: launch with programmatic dependent launch (`common.pdl_available` devices): the kernel
            waits for the one before it first thing, so only its launch overlaps that kernel.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        q: [T, Hq, D] roped queries in qkv's dtype, contiguous.
    """
    _check_impl(impl, "rope_write_kv")
    if impl == "eager":
        return rope_write_kv_eager(qkv, positions, rope, k_cache, v_cache, slots, pdl=pdl)
    Hq = _check_rope_write_kv(qkv, positions, rope, k_cache, v_cache, slots)
    check_pdl("rope_write_kv", pdl, qkv.device)
    T, (_, _, Hkv, D) = qkv.shape[0], k_cache.shape
    q = torch.empty((T, Hq, D), dtype=qkv.dtype, device=qkv.device)
    if T:
        _rope_write_kv_kernel[(T,)](
            qkv, positions, rope, slots, q, k_cache, v_cache,
            qkv.stride(0), rope.stride(0), rope.stride(1), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(1), v_cache.stride(2),
            HQ=Hq, HKV=Hkv, HALF=D // 2, BLOCK_HQ=triton.next_power_of_2(Hq),
            BLOCK_HKV=triton.next_power_of_2(Hkv), BLOCK_D=triton.next_power_of_2(D // 2), PDL=pdl, num_warps=4,
            **pdl_launch(pdl))
    return q


# ---------------------------------------------------------------------------------- SwiGLU

@triton.jit
def _silu_mul_kernel(G_ptr, U_ptr, Out_ptr, N, stride_g, stride_u, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    dtype = Out_ptr.dtype.element_ty
    g = tl.load(G_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U_ptr + row * stride_u + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out_ptr + row * stride_out + offs, silu_mul_rounded(g, u, dtype).to(dtype), mask=mask)


def silu_mul_eager(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments and result as `silu_mul`): the model's own op."""
    return model.silu_mul(gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """silu(gate) * up, elementwise.

    Args:
        gate, up: [T, N], one shape and dtype, last dims contiguous; rows may be strided, so the
            two halves of one packed gate|up output (`gu[:, :N]`, `gu[:, N:]`) go in as they are.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        [T, N] in their dtype, contiguous.
    """
    _check_impl(impl, "silu_mul")
    if impl == "eager":
        return silu_mul_eager(gate, up)
    if gate.dim() != 2 or gate.shape != up.shape or gate.dtype != up.dtype or gate.stride(1) != 1 or up.stride(1) != 1:
        raise ValueError(f"silu_mul: gate and up must be [T, N] of one shape and dtype with contiguous last dims; "
                         f"got {tuple(gate.shape)} {gate.dtype} strides {gate.stride()} and {tuple(up.shape)} "
                         f"{up.dtype} strides {up.stride()}")
    T, N = gate.shape
    out = torch.empty((T, N), dtype=gate.dtype, device=gate.device)
    if T and N:
        _silu_mul_kernel[(T, triton.cdiv(N, _SILU_BLOCK))](gate, up, out, N, gate.stride(0), up.stride(0),
                                                           out.stride(0), BLOCK=_SILU_BLOCK, num_warps=4)
    return out


def _check_impl(impl: str, name: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"{name}: impl must be one of {IMPLS}, got {impl!r}")
