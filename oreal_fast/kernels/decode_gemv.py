"""Skinny GEMMs of a decoder layer for forwards of few tokens (decode steps at a small live batch),
with the residual add, the RMSNorm, rope with the K/V-cache write, and SwiGLU fused into them: four
projections in four kernels, where the plain path runs them in eight to ten (two add_rms_norm,
rope_write_kv, silu_mul, four GEMMs, and the split-K reductions cuBLAS adds to the down and o
GEMMs at small T).

At a few tokens a decoder layer is latency-bound, not byte-bound: at the Qwen2.5-0.5B shape its
four weight matrices are a 9 us read on an H100, but each kernel costs a fixed slot of GPU time
(its launch, its ramp and its tail: benchmarks/RESULTS.md measured 4.5 us for the 2 MB q|k|v
GEMM at batch 1), so the count of kernels sets the step time.
Here the norm is the prologue of the GEMM that reads it, rope and the K/V write the epilogue of
the q|k|v GEMM, SwiGLU the epilogue of the gate|up GEMM, and the o and down GEMMs split their
reduction dimension K and leave fp32 partial sums that the next kernel adds in its prologue: no
reduction kernel, no atomics, deterministic.

The math, as the eager twins compute it (`add_rms_norm`, `rope_write_kv`, `silu_mul`:
`trunk_inference`):

    sublayer_out(x)  = x.sum(0).to(dtype) if x is partials [S, T, H] fp32 else x    # [T, H]
    norm_linear(x, r, norm_w, eps, W, b, swiglu):
        h, r = add_rms_norm(sublayer_out(x), r, norm_w, eps)    # r + x rounded, the norm rounded
        y = F.linear(h, W, b)                                   # fp32 accumulation, rounded once
        if swiglu:                                              # W = [W_gate; W_up]: [2 N, H]
            y = silu_mul(*y.chunk(2, dim=-1))
        return y, r
    norm_linear_rope_kv(x, r, norm_w, eps, W_qkv, b_qkv, positions, rope, k_cache, v_cache, slots):
        qkv, r = norm_linear(x, r, norm_w, eps, W_qkv, b_qkv)
        q = rope_write_kv(qkv, positions, rope, k_cache, v_cache, slots)   # writes k, v at the slots
        return q, r                                             # q [T, Hq, D], roped
    linear_partials(x, W, b, split):                            # S = cdiv(K, split) partial sums
        P[s] = x[:, s split:(s + 1) split].float() @ W[:, s split:(s + 1) split].float().T
        P[0] += b
        return P                                                # [S, T, N] fp32
    add_rms_norm_partials(x, r, norm_w, eps) = add_rms_norm(sublayer_out(x), r, norm_w, eps)

so a layer reads

    q, r   = norm_linear_rope_kv(P_down, r, attn_norm, eps, W_qkv, b_qkv,   # the previous layer's down
                                 positions, rope, k_cache, v_cache, slots)  # partials; k, v into the pool
    o      = cache.attend_roped(layer, q)
    P_o    = linear_partials(o, W_o, b_o)                          # one split at K = 896
    act, r = norm_linear(P_o, r, mlp_norm, eps, W_gate_up, swiglu=True)
    P_down = linear_partials(act, W_down)

and the model ends with `add_rms_norm_partials(P_down, r, norm, eps)`. Every value is rounded to
the activation dtype where the plain path (`add_rms_norm` + `nn.Linear` + `rope_write_kv` +
`silu_mul`) rounds it: a projection's output once, from its fp32 sum (a partials sum is that sum,
only in another order), the residual sum, the normalised row before the norm weight, rope's
products (after the table's cos and sin) and their sum, and silu before the product; v goes into
the pool as the projection rounded it. The kernels equal the twins up to the order of fp32 sums
(the dot, the partials, the mean square) and the fp32 rounding of 1/sqrt and exp (and on the GPU
a rope product and sum the compiler may contract into one fused multiply-add, as in
rope_write_kv).

Why rope fits the q|k|v epilogue: rope mixes column d of a head with column d + D/2 only, so a
program that owns the rows of both halves, pairs j0 .. j0 + R of one head (like a SwiGLU
program's gate and up rows), ropes its two accumulators elementwise; a q head's program stores
q, a k head's the roped k at the tokens' slots, a v head's v. The q|k|v output never reaches
memory un-roped, and rope_write_kv's kernel (its read of it, its writes) disappears.

Why SwiGLU sits in the gate|up epilogue, not in the down GEMM's prologue: a gate|up program owns
matching gate and up rows, so silu(g) u is made once per element and only the activation
[T, I] is written; a down prologue would remake it in every program that shares a K slice
(N / rows-per-program times over) and read gate and up, twice the bytes.

Budget at the Qwen2.5-0.5B shape (H 896, I 4864, q|k|v 1152 rows), T tokens, an H100 (132 SMs),
per layer: the weights once (29.7 MB; a program reads its rows once, into registers: at most
`_Tiles.tile_elems` elements, 8192 on CUDA, so several programs share an SM), plus from L2 the
activations every program needs. q|k|v: 144 programs of 4 pairs, 8 rows (14 KB of W each),
prologue T x 12.3 KB (3 down partials fp32, the residual), epilogue T x 32 B of the rope table
(cos and sin of both halves of 4 pairs, fp32) and the position and slot; it writes q, k and v
(T x 2.3 KB), what the q|k|v GEMM alone wrote before; o: 224 of 4 rows (7 KB), T x 1.8 KB;
gate|up: 1216 of 4 gate and 4 up rows (14 KB), T x 5.3 KB; down: 3 splits of 2048 columns x 224
blocks of 4 rows (16 KB), T x 4 KB. These launch shapes all come from one `_Tiles` (`_TILES_CUDA`,
with the split SPLIT_K); benchmarks/sweep_decode_gemv.py times others.
Workspace: the partials, [1, T, H] and [3, T, H] fp32 (T x 14 KB), written once and read by
every program of the next kernel. FLOPs: 2 T per weight, fp32 on the CUDA cores (no tensor
cores: at small T the weights' bytes bound the time, not the multiplies).

Accumulators: every sum is fp32 (dot products, partials, mean squares); inputs are widened to
fp32 before they multiply. Exactly one program (the first) writes the residual stream; the
others read the old one, which the new one never aliases.

Programmatic dependent launch (``pdl=True``, Hopper and later: `common.pdl_available`): a kernel is
launched while the one before it still runs. Each program loads its weight tile (its own, never
written by a kernel) and its bias, lets the next kernel launch (``gdc_launch_dependents``), and
only then waits for the previous kernel to finish (``gdc_wait``) before it reads activations or
writes anything; so the weight loads of one kernel overlap the tail of the one before, and the
kernel boundary costs less than a launch. Every kernel launched so waits, so a kernel finishes
only after all before it did: reads of outputs two kernels back stay ordered. A layer's kernels
so launched give the plain launches' outputs bit for bit on an H100, and since rope and the K/V
write are in the q|k|v kernel so do the engine's tokens (before, they changed: docs/kernels.md).
The engine launches them so wherever the device has it (`EngineConfig.gemv_pdl`).

Limits: the activations are re-read by every program, programs x T x (prologue bytes) from L2:
6.4 MB at T = 1 for gate|up, 100 MB at T = 16 (three times its weights), and the tokens run in
tiles of 2 to 4 at this shape (`_Tiles.product_elems`), one tile after another. So the path is
for small T only, up to a threshold the caller sets from a measurement (`InferenceModel(
gemv_max_tokens=...)`, benchmarks/test_bench_decode_gemv.py).
H (the norm's width) must fit one tile (H <= 16384). Forward only, no autograd. On CPU the Triton
path runs only under TRITON_INTERPRET=1, in fp32 (the interpreter rounds to bf16 by truncation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from oreal_fast.kernels.common import (TRITON_DTYPES, check_eager_impl, check_impl, check_pdl, gdc_launch_dependents,
                                       gdc_wait, multiprocessor_count, pdl_launch, tiles_for)
from oreal_fast.kernels.trunk_inference import (add_rms_norm_eager, check_kv_pool, check_rope_slots, rms_norm_rounded,
                                                rope_rounded, rope_write_kv_eager, silu_mul_eager, silu_mul_rounded)

# K columns per partial sum of `linear_partials` (a power of two): the down projection (K 4864)
# gets 3 splits, the o projection (K 896) 1; one split is one program's tile width.
SPLIT_K = 2048
_MAX_NORM_WIDTH = 16384


@dataclass(frozen=True)
class _Tiles:
    """Launch shape of the kernels, one for all four (benchmarks/sweep_decode_gemv.py sweeps it):
    the weight tile a program holds, the rows it owns, the token tile, warps and stages."""

    # elements of one program's weight tile (rows x tile width, both halves with SwiGLU or rope),
    # held in registers for the whole program: 8192 at 4 warps is 64 fp32 a thread, so several
    # programs fit an SM
    tile_elems: int
    # rows (pairs with rope) a program owns at most, a power of two: fewer where the tile would
    # outgrow tile_elems or the programs leave a multiprocessor idle (`_rows_per_program`)
    max_rows: int
    # elements of the tokens x rows x width product of one token tile, fp32 in registers
    product_elems: int
    num_warps: int
    # Triton's default: the one loop runs over token tiles (one or two at a decode step's T)
    num_stages: int


_TILES_CUDA = _Tiles(tile_elems=8192, max_rows=8, product_elems=16384, num_warps=4, num_stages=3)
# The interpreter has no multiprocessors to fill, so a program owns max_rows rows (every tile up to
# 2 x _MAX_NORM_WIDTH wide fits): few, so tests run several programs and a ragged last one; and
# small token tiles, so they run several token tiles.
_TILES_INTERPRET = _Tiles(tile_elems=4 * 2 * _MAX_NORM_WIDTH, max_rows=4, product_elems=1024, num_warps=4,
                          num_stages=3)


# ---------------------------------------------------------------------------------- kernels
# Index tensors are 3-D, [tokens, rows, width]: t [BLOCK_T, 1, 1], n [1, BLOCK_N, 1],
# h or k [1, 1, width], so the weight tile [1, BLOCK_N, width], the token tile [BLOCK_T, 1, width]
# and their product share one layout and each token tile takes one reduction over the width.

@triton.jit
def _residual_tile(X_ptr, R_ptr, t, h, mask, stride_xs, stride_xt, stride_r, dtype: tl.constexpr,
                   NUM_SPLITS: tl.constexpr, PARTIALS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The residual stream after the add at rows t, columns h (fp32 holding dtype values):
    residual + sublayer_out(x)."""
    x = tl.load(X_ptr + t * stride_xt + h, mask=mask, other=0.0).to(tl.float32)
    if PARTIALS:
        # a fixed order: the same sum at every replay; the loads are unrolled, so issued together
        for s in tl.static_range(1, NUM_SPLITS):
            x += tl.load(X_ptr + s * stride_xs + t * stride_xt + h, mask=mask, other=0.0)
        x = x.to(dtype).to(tl.float32)  # the sublayer's output, rounded once as its GEMM rounds it
    if HAS_RESIDUAL:
        r = tl.load(R_ptr + t * stride_r + h, mask=mask, other=0.0).to(tl.float32)
        x = (r + x).to(dtype).to(tl.float32)  # the residual stream lives in the activation dtype
    return x


@triton.jit
def _rms_norm_tile(x, NormW_ptr, h, hmask, H, eps, dtype: tl.constexpr, AXIS: tl.constexpr):
    """rms_norm along AXIS (x's last) of x (fp32 holding dtype values), as dtype values in fp32."""
    w = tl.load(NormW_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    return rms_norm_rounded(x, w, H, eps, dtype, AXIS).to(dtype).to(tl.float32)


@triton.jit
def _normed_tile(X_ptr, R_ptr, NormW_ptr, ROut_ptr, t, h, hmask, T, H, stride_xs, stride_xt, stride_r, eps,
                 writer, dtype: tl.constexpr, NUM_SPLITS: tl.constexpr, PARTIALS: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr, WRITE_RESIDUAL: tl.constexpr):
    """A token tile's prologue: the residual stream after the add at tokens t (stored by the one
    `writer` program; the others only read the old stream), normed: [BLOCK_T, 1, BLOCK_H] fp32
    holding dtype values."""
    mask = (t < T) & hmask
    x = _residual_tile(X_ptr, R_ptr, t, h, mask, stride_xs, stride_xt, stride_r, dtype,
                       NUM_SPLITS, PARTIALS, HAS_RESIDUAL)
    if WRITE_RESIDUAL:
        if writer:
            tl.store(ROut_ptr + t * H + h, x.to(dtype), mask=mask)
    return _rms_norm_tile(x, NormW_ptr, h, hmask, H, eps, dtype, 2)


@triton.jit
def _norm_linear_kernel(X_ptr, R_ptr, NormW_ptr, W_ptr, B_ptr, Y_ptr, ROut_ptr,
                        T, H, N, stride_xs, stride_xt, stride_r, stride_w, stride_y, eps,
                        NUM_SPLITS: tl.constexpr, PARTIALS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                        WRITE_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    """Program p: output columns p BLOCK_N .. + BLOCK_N (with SWIGLU, those gate rows and the up
    rows N further) for every token. Its weight rows are read once, before the token loop; each
    token tile's prologue remakes the normed rows from x and the residual (H is small), so no
    program waits for another."""
    pid = tl.program_id(0)
    dtype = Y_ptr.dtype.element_ty
    n_2d = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [1, BLOCK_N]
    n = n_2d[:, :, None]
    h = tl.arange(0, BLOCK_H)[None, None, :]
    hmask = h < H
    w_mask = (n < N) & hmask
    w = tl.load(W_ptr + n * stride_w + h, mask=w_mask, other=0.0).to(tl.float32)  # [1, BLOCK_N, BLOCK_H]
    if SWIGLU:
        w_up = tl.load(W_ptr + (N + n) * stride_w + h, mask=w_mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(B_ptr + n_2d, mask=n_2d < N, other=0.0).to(tl.float32)  # [1, BLOCK_N]
        if SWIGLU:
            b_up = tl.load(B_ptr + N + n_2d, mask=n_2d < N, other=0.0).to(tl.float32)
    if PDL:  # the weights are loading; what follows reads the previous kernel's outputs
        gdc_launch_dependents()
        gdc_wait()
    for t0 in range(0, T, BLOCK_T):
        t_2d = t0 + tl.arange(0, BLOCK_T)[:, None]  # [BLOCK_T, 1]
        t = t_2d[:, :, None].to(tl.int64)
        xn = _normed_tile(X_ptr, R_ptr, NormW_ptr, ROut_ptr, t, h, hmask, T, H, stride_xs, stride_xt, stride_r, eps,
                          pid == 0, dtype, NUM_SPLITS, PARTIALS, HAS_RESIDUAL, WRITE_RESIDUAL)  # [BLOCK_T, 1, BLOCK_H]
        y = tl.sum(xn * w, 2)  # [BLOCK_T, BLOCK_N] fp32
        if HAS_BIAS:
            y += b
        if SWIGLU:
            u = tl.sum(xn * w_up, 2)
            if HAS_BIAS:
                u += b_up
            # gate and up rounded as the GEMM's output, silu rounded as its own op's output
            y = silu_mul_rounded(y.to(dtype).to(tl.float32), u.to(dtype).to(tl.float32), dtype)
        tl.store(Y_ptr + t_2d * stride_y + n_2d, y.to(dtype), mask=(t_2d < T) & (n_2d < N))


@triton.jit
def _norm_linear_rope_kv_kernel(X_ptr, R_ptr, NormW_ptr, W_ptr, B_ptr, Pos_ptr, Rope_ptr, Slot_ptr,
                                Q_ptr, K_ptr, V_ptr, ROut_ptr,
                                T, H, stride_xs, stride_xt, stride_r, stride_w, stride_rope_pos, stride_rope_cs,
                                stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, eps,
                                HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                                NUM_SPLITS: tl.constexpr, PARTIALS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                                WRITE_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
                                BLOCK_J: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    """Program p: pairs j0 .. j0 + BLOCK_J of one head (q heads, then k, then v; a head's HALF
    pairs in cdiv(HALF, BLOCK_J) programs), i.e. the weight rows head D + j and head D + HALF + j:
    both halves of the columns rope turns into each other, so rope is elementwise between the two
    accumulators. As `_norm_linear_kernel` otherwise; a q head's program stores into q, a k head's
    (roped) and a v head's (as is) into the pools at the tokens' slots."""
    pid = tl.program_id(0)
    dtype = Q_ptr.dtype.element_ty
    head = pid // ((HALF + BLOCK_J - 1) // BLOCK_J)
    j_2d = (pid % ((HALF + BLOCK_J - 1) // BLOCK_J)) * BLOCK_J + tl.arange(0, BLOCK_J)[None, :]  # [1, BLOCK_J]
    j = j_2d[:, :, None]
    h = tl.arange(0, BLOCK_H)[None, None, :]
    hmask = h < H
    w_mask = (j < HALF) & hmask
    row = head.to(tl.int64) * 2 * HALF + j  # the first half's rows; the second's are HALF further
    w1 = tl.load(W_ptr + row * stride_w + h, mask=w_mask, other=0.0).to(tl.float32)  # [1, BLOCK_J, BLOCK_H]
    w2 = tl.load(W_ptr + (row + HALF) * stride_w + h, mask=w_mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b_row = head * 2 * HALF + j_2d
        b1 = tl.load(B_ptr + b_row, mask=j_2d < HALF, other=0.0).to(tl.float32)  # [1, BLOCK_J]
        b2 = tl.load(B_ptr + HALF + b_row, mask=j_2d < HALF, other=0.0).to(tl.float32)
    if PDL:  # the weights are loading; what follows reads the previous kernel's outputs
        gdc_launch_dependents()
        gdc_wait()
    for t0 in range(0, T, BLOCK_T):
        t_2d = t0 + tl.arange(0, BLOCK_T)[:, None]  # [BLOCK_T, 1]
        t = t_2d[:, :, None].to(tl.int64)
        xn = _normed_tile(X_ptr, R_ptr, NormW_ptr, ROut_ptr, t, h, hmask, T, H, stride_xs, stride_xt, stride_r, eps,
                          pid == 0, dtype, NUM_SPLITS, PARTIALS, HAS_RESIDUAL, WRITE_RESIDUAL)  # [BLOCK_T, 1, BLOCK_H]
        y1 = tl.sum(xn * w1, 2)  # [BLOCK_T, BLOCK_J] fp32
        y2 = tl.sum(xn * w2, 2)
        if HAS_BIAS:
            y1 += b1
            y2 += b2
        # rounded as the q|k|v GEMM's output, which rope reads
        y1, y2 = y1.to(dtype).to(tl.float32), y2.to(dtype).to(tl.float32)
        t_mask = t_2d < T
        out_mask = t_mask & (j_2d < HALF)
        if head < HQ + HKV:  # q or k: roped
            cos_row = Rope_ptr + tl.load(Pos_ptr + t_2d, mask=t_mask, other=0) * stride_rope_pos  # [BLOCK_T, 1]
            sin_row = cos_row + stride_rope_cs
            y1, y2 = rope_rounded(y1, y2, tl.load(cos_row + j_2d, mask=out_mask, other=0.0),
                                  tl.load(cos_row + HALF + j_2d, mask=out_mask, other=0.0),
                                  tl.load(sin_row + j_2d, mask=out_mask, other=0.0),
                                  tl.load(sin_row + HALF + j_2d, mask=out_mask, other=0.0), dtype)
        if head < HQ:
            dst = Q_ptr + (t_2d * HQ + head) * 2 * HALF + j_2d  # q [T, HQ, 2 HALF]
        else:
            slot = tl.load(Slot_ptr + t_2d, mask=t_mask, other=0)  # int64: slot * stride may exceed int32
            if head < HQ + HKV:
                dst = K_ptr + slot * stride_k_slot + (head - HQ) * stride_k_head + j_2d
            else:
                dst = V_ptr + slot * stride_v_slot + (head - HQ - HKV) * stride_v_head + j_2d
        tl.store(dst, y1.to(dtype), mask=out_mask)
        tl.store(dst + HALF, y2.to(dtype), mask=out_mask)


@triton.jit
def _add_rms_norm_partials_kernel(X_ptr, R_ptr, NormW_ptr, Out_ptr, ROut_ptr, H, stride_xs, stride_xt, stride_r,
                                  eps, NUM_SPLITS: tl.constexpr, PARTIALS: tl.constexpr,
                                  HAS_RESIDUAL: tl.constexpr, WRITE_RESIDUAL: tl.constexpr,
                                  BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # nothing of its own to load first: only the launch is overlapped
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    dtype = Out_ptr.dtype.element_ty
    h = tl.arange(0, BLOCK_H)
    hmask = h < H
    x = _residual_tile(X_ptr, R_ptr, t, h, hmask, stride_xs, stride_xt, stride_r, dtype,
                       NUM_SPLITS, PARTIALS, HAS_RESIDUAL)
    if WRITE_RESIDUAL:
        tl.store(ROut_ptr + t * H + h, x.to(dtype), mask=hmask)
    tl.store(Out_ptr + t * H + h, _rms_norm_tile(x, NormW_ptr, h, hmask, H, eps, dtype, 0).to(dtype), mask=hmask)


@triton.jit
def _linear_partials_kernel(X_ptr, W_ptr, B_ptr, P_ptr, T, K, N, stride_x, stride_w, stride_ps, stride_pt,
                            HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """Program (p, s): rows p BLOCK_N .. + BLOCK_N of W over the K split s (one tile of BLOCK_K),
    read once, for every token, into P[s]."""
    split = tl.program_id(1)
    n_2d = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [1, BLOCK_N]
    n = n_2d[:, :, None]
    k = (split * BLOCK_K + tl.arange(0, BLOCK_K))[None, None, :]
    kmask = k < K
    w = tl.load(W_ptr + n * stride_w + k, mask=(n < N) & kmask, other=0.0).to(tl.float32)  # [1, BLOCK_N, BLOCK_K]
    if HAS_BIAS:
        # in the first partial only: the consumer's sum adds it before its one rounding, as addmm does
        b = tl.load(B_ptr + n_2d, mask=(n_2d < N) & (split == 0), other=0.0).to(tl.float32)
    if PDL:  # the weights are loading; what follows reads the previous kernel's outputs
        gdc_launch_dependents()
        gdc_wait()
    for t0 in range(0, T, BLOCK_T):
        t_2d = t0 + tl.arange(0, BLOCK_T)[:, None]  # [BLOCK_T, 1]
        t = t_2d[:, :, None].to(tl.int64)
        x = tl.load(X_ptr + t * stride_x + k, mask=(t < T) & kmask, other=0.0).to(tl.float32)
        y = tl.sum(x * w, 2)  # [BLOCK_T, BLOCK_N] fp32
        if HAS_BIAS:
            y += b
        tl.store(P_ptr + split * stride_ps + t_2d * stride_pt + n_2d, y, mask=(t_2d < T) & (n_2d < N))


# ---------------------------------------------------------------------------------- launchers

def _tiles(device: torch.device) -> _Tiles:
    return tiles_for(device, _TILES_CUDA, _TILES_INTERPRET)


def _launch_options(tiles: _Tiles, pdl: bool) -> dict[str, int | bool]:
    return {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages, **pdl_launch(pdl)}


def _rows_per_program(num_rows: int, num_splits: int, width: int, tiles: _Tiles, device: torch.device) -> int:
    """Weight rows a program owns (width: its tile's columns, both halves with SwiGLU or rope): the
    most, up to tiles.max_rows, whose tile fits tiles.tile_elems and (on CUDA) whose programs still
    give every multiprocessor one; at least 1."""
    min_programs = multiprocessor_count(device) if device.type == "cuda" else 1
    rows = tiles.max_rows
    while rows > 1 and (rows * width > tiles.tile_elems or triton.cdiv(num_rows, rows) * num_splits < min_programs):
        rows //= 2
    return rows


def _token_tile(T: int, tile_elems: int, tiles: _Tiles) -> int:
    """Tokens per tile: their product with the weight tile within tiles.product_elems."""
    return max(1, min(triton.next_power_of_2(T), tiles.product_elems // tile_elems))


def _norm_linear_grid(T: int, H: int, N: int, swiglu: bool, tiles: _Tiles,
                      device: torch.device) -> tuple[tuple[int], dict[str, int]]:
    """(grid, block sizes) of a `_norm_linear_kernel` launch."""
    BLOCK_H = triton.next_power_of_2(H)
    width = BLOCK_H * (2 if swiglu else 1)
    rows = _rows_per_program(N, 1, width, tiles, device)
    return (triton.cdiv(N, rows),), {"BLOCK_T": _token_tile(T, rows * width, tiles), "BLOCK_N": rows,
                                     "BLOCK_H": BLOCK_H}


def _rope_kv_grid(T: int, H: int, heads: int, half: int, tiles: _Tiles,
                  device: torch.device) -> tuple[tuple[int], dict[str, int]]:
    """(grid, block sizes) of a `_norm_linear_rope_kv_kernel` launch over `heads` heads of `half` pairs."""
    BLOCK_H = triton.next_power_of_2(H)
    # pairs a program owns, chosen as rows are with SwiGLU's two halves; no more than a head has
    pairs = min(_rows_per_program(heads * half, 1, 2 * BLOCK_H, tiles, device), triton.next_power_of_2(half))
    return (heads * triton.cdiv(half, pairs),), {"BLOCK_T": _token_tile(T, 2 * pairs * BLOCK_H, tiles),
                                                 "BLOCK_J": pairs, "BLOCK_H": BLOCK_H}


def _linear_partials_grid(T: int, K: int, N: int, split: int, tiles: _Tiles,
                          device: torch.device) -> tuple[tuple[int, int], dict[str, int]]:
    """(grid: row blocks x splits, block sizes) of a `_linear_partials_kernel` launch."""
    num_splits = triton.cdiv(K, split)
    block_k = min(split, triton.next_power_of_2(K))
    rows = _rows_per_program(N, num_splits, block_k, tiles, device)
    return (triton.cdiv(N, rows), num_splits), {"BLOCK_T": _token_tile(T, rows * block_k, tiles), "BLOCK_N": rows,
                                                "BLOCK_K": block_k}


def _check_sublayer(name: str, x: torch.Tensor, residual: torch.Tensor | None,
                    norm_weight: torch.Tensor) -> tuple[int, int]:
    """x [T, H] in the norm weight's dtype or [S, T, H] fp32 partials, residual [T, H] or None,
    one device, contiguous last dims; returns (T, H)."""
    dtype = norm_weight.dtype
    H = norm_weight.shape[0] if norm_weight.dim() == 1 else -1
    partials = x.dim() == 3
    if not ((x.dim() == 2 and x.dtype == dtype) or (partials and x.dtype == torch.float32)) or x.shape[-1] != H \
            or x.stride(-1) != 1 or (partials and x.shape[0] < 1):
        raise ValueError(f"{name}: x must be [T, H] in the norm weight's dtype or [S >= 1, T, H] fp32 partial "
                         f"sums, H = norm_weight's length, last dim contiguous; got x {tuple(x.shape)} {x.dtype} "
                         f"strides {x.stride()}, norm_weight {tuple(norm_weight.shape)} {dtype}")
    T = x.shape[-2]
    if residual is not None and (residual.shape != (T, H) or residual.dtype != dtype or residual.stride(1) != 1):
        raise ValueError(f"{name}: residual must be [T, H] = {(T, H)} in {dtype} with a contiguous last dim; "
                         f"got {tuple(residual.shape)} {residual.dtype} strides {residual.stride()}")
    if H > _MAX_NORM_WIDTH:
        raise ValueError(f"{name}: the norm's width H = {H} exceeds one tile ({_MAX_NORM_WIDTH})")
    return T, H


def _check_linear(name: str, K: int, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                  swiglu: bool = False) -> int:
    """weight [rows, K] and bias [rows] or None in `dtype`, weight's last dim contiguous, an even
    row count with SwiGLU; returns the output width (rows, or rows / 2 with SwiGLU)."""
    rows = weight.shape[0] if weight.dim() == 2 else -1
    if weight.dim() != 2 or weight.shape[1] != K or weight.dtype != dtype or weight.stride(1) != 1 \
            or (swiglu and rows % 2):
        raise ValueError(f"{name}: weight must be [{'2 N' if swiglu else 'N'}, K = {K}] in {dtype} with a "
                         f"contiguous last dim; got {tuple(weight.shape)} {weight.dtype} strides {weight.stride()}")
    if bias is not None and (bias.shape != (rows,) or bias.dtype != dtype or bias.stride(0) != 1):
        raise ValueError(f"{name}: bias must be [{rows}] contiguous in {dtype}; got {tuple(bias.shape)} {bias.dtype}")
    return rows // 2 if swiglu else rows


def _check_device_and_dtype(name: str, dtype: torch.dtype, *tensors: torch.Tensor | None) -> None:
    """One device for all; an activation dtype the kernels take there (the interpreter rounds to
    bf16/fp16 by truncation, so on CPU fp32 only)."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"{name}: all inputs must be on one device; got {sorted(str(d) for d in devices)}")
    if dtype not in TRITON_DTYPES or (devices.pop().type == "cpu" and dtype != torch.float32):
        raise ValueError(f"{name}(impl='triton') takes bf16, fp16 or fp32 on CUDA and fp32 on CPU "
                         f"(TRITON_INTERPRET=1); got {dtype}")


def _sublayer_args(x: torch.Tensor) -> tuple[int, int, int, bool]:
    """(num_splits, stride_xs, stride_xt, partials) of x [T, H] or [S, T, H]."""
    if x.dim() == 3:
        return x.shape[0], x.stride(0), x.stride(1), True
    return 1, 0, x.stride(0), False


def _launch_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None, swiglu: bool,
                        T: int, H: int, N: int, tiles: _Tiles, pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dtype, device = norm_weight.dtype, norm_weight.device
    num_splits, stride_xs, stride_xt, partials = _sublayer_args(x)
    y = torch.empty((T, N), dtype=dtype, device=device)
    write_residual = partials or residual is not None
    r_out = torch.empty((T, H), dtype=dtype, device=device) if write_residual else x
    if T and N:
        grid, blocks = _norm_linear_grid(T, H, N, swiglu, tiles, device)
        r = x if residual is None else residual  # a placeholder pointer without a residual
        _norm_linear_kernel[grid](
            x, r, norm_weight, weight, weight if bias is None else bias, y, r_out,
            T, H, N, stride_xs, stride_xt, r.stride(0), weight.stride(0), y.stride(0), eps,
            NUM_SPLITS=num_splits, PARTIALS=partials, HAS_RESIDUAL=residual is not None,
            WRITE_RESIDUAL=write_residual, HAS_BIAS=bias is not None, SWIGLU=swiglu, PDL=pdl, **blocks,
            **_launch_options(tiles, pdl))
    return y, r_out


def _launch_norm_linear_rope_kv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                                eps: float, weight: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
                                rope: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                                T: int, H: int, Hq: int, tiles: _Tiles, pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dtype, device = norm_weight.dtype, norm_weight.device
    _, _, Hkv, D = k_cache.shape
    num_splits, stride_xs, stride_xt, partials = _sublayer_args(x)
    q = torch.empty((T, Hq, D), dtype=dtype, device=device)
    write_residual = partials or residual is not None
    r_out = torch.empty((T, H), dtype=dtype, device=device) if write_residual else x
    if T:
        grid, blocks = _rope_kv_grid(T, H, Hq + 2 * Hkv, D // 2, tiles, device)
        r = x if residual is None else residual  # a placeholder pointer without a residual
        _norm_linear_rope_kv_kernel[grid](
            x, r, norm_weight, weight, weight if bias is None else bias, positions, rope, slots,
            q, k_cache, v_cache, r_out,
            T, H, stride_xs, stride_xt, r.stride(0), weight.stride(0), rope.stride(0), rope.stride(1),
            k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2), eps,
            HQ=Hq, HKV=Hkv, HALF=D // 2, NUM_SPLITS=num_splits, PARTIALS=partials,
            HAS_RESIDUAL=residual is not None, WRITE_RESIDUAL=write_residual, HAS_BIAS=bias is not None, PDL=pdl,
            **blocks, **_launch_options(tiles, pdl))
    return q, r_out


def _launch_linear_partials(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, split: int,
                            T: int, K: int, N: int, tiles: _Tiles, pdl: bool) -> torch.Tensor:
    out = torch.empty((triton.cdiv(K, split), T, N), dtype=torch.float32, device=x.device)
    if T and N:
        grid, blocks = _linear_partials_grid(T, K, N, split, tiles, x.device)
        _linear_partials_kernel[grid](
            x, weight, weight if bias is None else bias, out, T, K, N, x.stride(0), weight.stride(0),
            out.stride(0), out.stride(1), HAS_BIAS=bias is not None, PDL=pdl, **blocks,
            **_launch_options(tiles, pdl))
    return out


def _launch_add_rms_norm_partials(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                                  T: int, H: int, tiles: _Tiles, pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    num_splits, stride_xs, stride_xt, partials = _sublayer_args(x)
    out = torch.empty((T, H), dtype=weight.dtype, device=weight.device)
    write_residual = partials or residual is not None
    r_out = torch.empty((T, H), dtype=weight.dtype, device=weight.device) if write_residual else x
    if T:
        r = x if residual is None else residual  # a placeholder pointer without a residual
        _add_rms_norm_partials_kernel[(T,)](
            x, r, weight, out, r_out, H, stride_xs, stride_xt, r.stride(0), eps, NUM_SPLITS=num_splits,
            PARTIALS=partials, HAS_RESIDUAL=residual is not None, WRITE_RESIDUAL=write_residual,
            BLOCK_H=triton.next_power_of_2(H), PDL=pdl, **_launch_options(tiles, pdl))
    return out, r_out


# ---------------------------------------------------------------------------------- public API

def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                weight: torch.Tensor, bias: torch.Tensor | None = None, *, swiglu: bool = False,
                pdl: bool = False, impl: str = "triton") -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add, the RMSNorm and the projection of the normed rows, in one kernel.

    Args:
        x: [T, H] in the activation dtype (a sublayer's output, or the embeddings), or
            [S, T, H] fp32 partial sums whose sum is the sublayer's output (`linear_partials`).
        residual: [T, H] in the activation dtype, or None (nothing to add).
        norm_weight: [H] in the activation dtype (bf16/fp16/fp32): the RMSNorm's weight.
        eps: added to the mean square.
        weight: [N, H] in the activation dtype, or with `swiglu` [2 N, H] (gate rows, then up rows).
        bias: [N] (with `swiglu` [2 N]) in the activation dtype, or None.
        swiglu: return silu(gate) * up of the two halves of the projection.
        pdl: launch with programmatic dependent launch (module docstring; `pdl_available` devices).
        impl: "triton" (CUDA, or CPU under TRITON_INTERPRET=1) or "eager".

    Returns:
        y: [T, N] in the activation dtype, contiguous.
        residual: [T, H] the residual stream after the add, contiguous (x itself when x is
            [T, H] and residual is None).
    """
    check_impl("norm_linear", impl)
    if impl == "eager":
        return norm_linear_eager(x, residual, norm_weight, eps, weight, bias, swiglu=swiglu, pdl=pdl)
    T, H = _check_sublayer("norm_linear", x, residual, norm_weight)
    N = _check_linear("norm_linear", H, weight, bias, norm_weight.dtype, swiglu)
    _check_device_and_dtype("norm_linear", norm_weight.dtype, x, residual, norm_weight, weight, bias)
    check_pdl("norm_linear", pdl, norm_weight.device)
    return _launch_norm_linear(x, residual, norm_weight, eps, weight, bias, swiglu, T, H, N,
                               _tiles(norm_weight.device), pdl)


def norm_linear_eager(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor, bias: torch.Tensor | None = None, *, swiglu: bool = False,
                      pdl: bool = False, impl: str = "eager") -> tuple[torch.Tensor, torch.Tensor]:
    """The eager twin (same arguments and results as `norm_linear`): the plain path's ops (``pdl``,
    a launch option, changes nothing here)."""
    check_eager_impl("norm_linear_eager", impl)
    if x.dim() == 3:
        x = x.sum(0).to(norm_weight.dtype)
    h, residual = add_rms_norm_eager(x, residual, norm_weight, eps)
    y = F.linear(h, weight, bias)
    if swiglu:
        y = silu_mul_eager(*y.chunk(2, dim=-1))
    return y, residual


def norm_linear_rope_kv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor, rope: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, *, pdl: bool = False,
                        impl: str = "triton") -> tuple[torch.Tensor, torch.Tensor]:
    """`norm_linear` of the q|k|v projection with `trunk_inference.rope_write_kv` in its epilogue:
    the residual add, the RMSNorm, the projection, rope of q and k, and k, v written into the
    paged pool, in one kernel (module docstring).

    Args:
        x, residual, norm_weight, eps: as `norm_linear`.
        weight: [(Hq + 2 Hkv) D, H] in the activation dtype: Hq query heads' rows, then Hkv key
            heads', then Hkv value heads' (Hq >= 1; Hkv and D from the pool).
        bias: [(Hq + 2 Hkv) D] in the activation dtype, or None.
        positions: [T] int64, each token's position, in [0, P).
        rope: [P, 2, D] fp32 cos and sin per position (`decoder.rope_table`).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D] in the activation dtype: one layer's
            pools, written in place at the slots.
        slots: [T] int64 pool slot (block * block_size + offset) of each token, in range (unchecked,
            as `rope_write_kv`'s: several tokens may name one slot, which of them lands is unspecified).
        pdl: launch with programmatic dependent launch (module docstring; `pdl_available` devices).
        impl: "triton" (CUDA, or CPU under TRITON_INTERPRET=1) or "eager".

    Returns:
        q: [T, Hq, D] the roped queries in the activation dtype, contiguous.
        residual: [T, H] the residual stream after the add, as `norm_linear` returns it.
    """
    check_impl("norm_linear_rope_kv", impl)
    if impl == "eager":
        return norm_linear_rope_kv_eager(x, residual, norm_weight, eps, weight, bias, positions, rope, k_cache,
                                         v_cache, slots, pdl=pdl)
    name, dtype = "norm_linear_rope_kv", norm_weight.dtype
    T, H = _check_sublayer(name, x, residual, norm_weight)
    rows = _check_linear(name, H, weight, bias, dtype)
    Hkv, D = check_kv_pool(name, k_cache, v_cache)
    if rows % D or rows // D <= 2 * Hkv:
        raise ValueError(f"{name}: weight must be [(Hq + 2 Hkv) D, H] with Hq >= 1, the pool's Hkv = {Hkv} and "
                         f"D = {D}; got {rows} rows")
    if k_cache.dtype != dtype or v_cache.dtype != dtype:
        raise ValueError(f"{name}: the KV pool must hold the activation dtype {dtype}; got {k_cache.dtype} / "
                         f"{v_cache.dtype}")
    check_rope_slots(name, T, D, positions, rope, slots)
    _check_device_and_dtype(name, dtype, x, residual, norm_weight, weight, bias, positions, rope, k_cache, v_cache,
                            slots)
    check_pdl(name, pdl, norm_weight.device)
    return _launch_norm_linear_rope_kv(x, residual, norm_weight, eps, weight, bias, positions, rope, k_cache,
                                       v_cache, slots, T, H, rows // D - 2 * Hkv, _tiles(norm_weight.device), pdl)


def norm_linear_rope_kv_eager(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                              weight: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
                              rope: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                              *, pdl: bool = False, impl: str = "eager") -> tuple[torch.Tensor, torch.Tensor]:
    """The eager twin (same arguments, writes and results as `norm_linear_rope_kv`): the two
    twins it fuses, one after the other."""
    check_eager_impl("norm_linear_rope_kv_eager", impl)
    qkv, residual = norm_linear_eager(x, residual, norm_weight, eps, weight, bias)
    return rope_write_kv_eager(qkv, positions, rope, k_cache, v_cache, slots), residual


def add_rms_norm_partials(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                          *, pdl: bool = False, impl: str = "triton") -> tuple[torch.Tensor, torch.Tensor]:
    """`trunk_inference.add_rms_norm` of a sublayer's output given as partial sums: the final
    norm after a `linear_partials` down projection.

    Args:
        x: [S, T, H] fp32 partial sums of the sublayer's output, or [T, H] in weight's dtype.
        residual: [T, H] in weight's dtype, or None.
        weight: [H] bf16/fp16/fp32, the activation dtype.
        eps: added to the mean square.
        pdl: launch with programmatic dependent launch (module docstring).
        impl: "triton" (CUDA, or CPU under TRITON_INTERPRET=1) or "eager".

    Returns:
        normed: [T, H] rms_norm(residual + the sublayer's output), contiguous.
        residual: [T, H] the residual stream after the add (x itself when x is [T, H] and residual is None).
    """
    check_impl("add_rms_norm_partials", impl)
    if impl == "eager":
        return add_rms_norm_partials_eager(x, residual, weight, eps, pdl=pdl)
    T, H = _check_sublayer("add_rms_norm_partials", x, residual, weight)
    _check_device_and_dtype("add_rms_norm_partials", weight.dtype, x, residual, weight)
    check_pdl("add_rms_norm_partials", pdl, weight.device)
    return _launch_add_rms_norm_partials(x, residual, weight, eps, T, H, _tiles(weight.device), pdl)


def add_rms_norm_partials_eager(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                                *, pdl: bool = False, impl: str = "eager") -> tuple[torch.Tensor, torch.Tensor]:
    """The eager twin (same arguments and results as `add_rms_norm_partials`)."""
    check_eager_impl("add_rms_norm_partials_eager", impl)
    if x.dim() == 3:
        x = x.sum(0).to(weight.dtype)
    return add_rms_norm_eager(x, residual, weight, eps)


def linear_partials(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                    split: int = SPLIT_K, pdl: bool = False, impl: str = "triton") -> torch.Tensor:
    """x @ weight.T (+ bias) as fp32 partial sums over splits of K, for `norm_linear` or
    `add_rms_norm_partials` to add (and round once) in their prologue.

    Args:
        x: [T, K] bf16/fp16/fp32, last dim contiguous (rows may be strided).
        weight: [N, K] in x's dtype, last dim contiguous.
        bias: [N] in x's dtype, or None; added to the first partial.
        split: K columns per partial, a power of two >= 16.
        pdl: launch with programmatic dependent launch (module docstring).
        impl: "triton" (CUDA, or CPU under TRITON_INTERPRET=1) or "eager".

    Returns:
        [cdiv(K, split), T, N] fp32, contiguous.
    """
    check_impl("linear_partials", impl)
    if impl == "eager":
        return linear_partials_eager(x, weight, bias, split=split, pdl=pdl)
    T, K, N = _check_partials_args(x, weight, bias, split)
    _check_device_and_dtype("linear_partials", x.dtype, x, weight, bias)
    check_pdl("linear_partials", pdl, x.device)
    return _launch_linear_partials(x, weight, bias, split, T, K, N, _tiles(x.device), pdl)


def linear_partials_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                          split: int = SPLIT_K, pdl: bool = False, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments and result as `linear_partials`): one fp32 matmul per split."""
    check_eager_impl("linear_partials_eager", impl)
    _check_partials_args(x, weight, bias, split)
    out = torch.stack([xs.float() @ ws.float().T for xs, ws in zip(x.split(split, 1), weight.split(split, 1))])
    if bias is not None:
        out[0] += bias.float()
    return out


def _check_partials_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         split: int) -> tuple[int, int, int]:
    """Validates `linear_partials`' arguments; returns (T, K, N)."""
    if split < 16 or split & (split - 1):
        raise ValueError(f"linear_partials: split must be a power of two >= 16, got {split}")
    if x.dim() != 2 or x.stride(1) != 1 or x.shape[1] < 1:
        raise ValueError(f"linear_partials: x must be [T, K >= 1] with a contiguous last dim; got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    return x.shape[0], x.shape[1], _check_linear("linear_partials", x.shape[1], weight, bias, x.dtype)
