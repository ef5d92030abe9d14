"""Tensor-core GEMMs for at most a few dozen tokens (decode steps at a small live batch), with
SwiGLU in the gate|up epilogue and the o and down projections left as fp32 partial sums over
splits of K.

The math, as the eager twin computes it (`skinny_linear_eager`):

    skinny_linear(x, W, b, swiglu=False, splits=1):             # x [T, K], W [N', K]
        if splits == 1 and not swiglu:
            return F.linear(x, W, b)                            # fp32 accumulation, rounded once
        if swiglu:                                              # W = [W_gate; W_up]: [2 N, K]
            g, u = F.linear(x, W, b).chunk(2, dim=-1)           # each rounded as the GEMM rounds it
            return silu_mul(g, u)                               # [T, N], silu rounded, then the product
        P[s] = x[:, s c:(s + 1) c].float() @ W[:, s c:(s + 1) c].float().T    # c = cdiv(K, splits)
        P[0] += b                                                  # rounded up to whole BLOCK_K tiles
        return P                                                # [splits, T, N'] fp32

Partial sums are what `decode_gemv.add_rms_norm_partials` takes: it adds them in a fixed order and
rounds once, as the plain path rounds the GEMM's output, and fuses the residual add and the norm.
So a layer at T tokens runs

    h, r   = add_rms_norm_partials(P_down, r, attn_norm)        # the last layer's down partials
    qkv    = skinny_linear(h, W_qkv, b_qkv)
    o      = cache.attend(layer, qkv, positions, rope)          # rope, the K/V write, attention
    P_o    = skinny_linear(o, W_o, splits=S_o)
    h, r   = add_rms_norm_partials(P_o, r, mlp_norm)
    a      = skinny_linear(h, W_gate_up, swiglu=True)
    P_down = skinny_linear(a, W_down, splits=S_down)

seven kernels besides attention, where the cuBLAS path runs eight to ten (two add_rms_norm,
rope_write_kv, silu_mul, four GEMMs and cuBLAS's split-K reductions of the o and down GEMMs).

Why a kernel of our own at a few dozen tokens: the weights' bytes bound the time (29.7 MB a layer at
the Qwen2.5-0.5B shape, 10 us on an H100), not the multiplies, and cuBLAS picks tiles that leave the
small projections latency-bound (4-4.5 us for the 2 MB q|k|v and the 1.6 MB o GEMM at 16 tokens)
and adds a reduction kernel after split-K GEMMs. Here every program streams its own rows of W once,
in tiles of BLOCK_K columns, through the tensor cores against all T tokens (padded to 16 rows, the
smallest dot tile; the padding is masked), so the grid is set by N (and the splits of K) alone: enough
programs to keep every multiprocessor's loads in flight, whatever T.
With `pdl`, each kernel launches while the one before it finishes (programmatic dependent launch)
and waits for it before its first load of x. The engine launches them plainly: in its decode step
an early launch only holds multiprocessors (the weights stream after the wait), and on an H100 the
16-row step took 1.32 ms with it against 1.09 without (benchmarks/RESULTS.md).

Budget at T tokens, N' rows of W, K columns: reads W once (N' K elements), x once per program
from L2 (T K elements), writes T N' (half with SwiGLU; fp32 with splits). FLOPs 2 T N' K on the
tensor cores (bf16/fp16 inputs, fp32 accumulators; fp32 inputs use a true fp32 dot).
Workspace: none besides the output.

Limits: forward only, no autograd; x, W and b share one dtype and device; K, N' >= 1 (T may be
0). The token tile is at most 64 rows (`_MAX_TOKEN_TILE`), so larger T loops over tiles and
re-reads W from L2: the kernel is for T up to a few dozen (the caller's threshold,
`InferenceModel(skinny_max_tokens)`; on an H100 the gate|up kernel loses to cuBLAS's from 32 rows).
On CPU the Triton path runs only under TRITON_INTERPRET=1, in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from oreal_fast.kernels.common import (check_eager_impl, check_impl, check_pdl, check_triton_operands, dot_precision,
                                       gdc_launch_dependents, gdc_wait, multiprocessor_count, pdl_launch, tiles_for)
from oreal_fast.kernels.trunk_inference import silu_mul_eager, silu_mul_rounded

_MAX_TOKEN_TILE = 64


@dataclass(frozen=True)
class _Tiles:
    """Launch shape: the K tile, the most and fewest rows of W a program owns, how many programs a
    multiprocessor should get (fewer rows a program until it does), warps and pipeline stages."""

    block_k: int
    max_rows: int
    min_rows: int
    programs_per_sm: int
    num_warps: int
    num_stages: int


_TILES_CUDA = _Tiles(block_k=128, max_rows=64, min_rows=16, programs_per_sm=1, num_warps=4, num_stages=4)
# The interpreter: small tiles, so tests cross K tiles, row blocks and splits at small shapes.
_TILES_INTERPRET = _Tiles(block_k=16, max_rows=16, min_rows=16, programs_per_sm=1, num_warps=1, num_stages=1)


@triton.jit
def _skinny_linear_kernel(X_ptr, W_ptr, B_ptr, Y_ptr, T, K, N, k_per_split,
                          stride_x, stride_w, stride_ys, stride_yt,
                          HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, PARTIALS: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          DOT_PREC: tl.constexpr, PDL: tl.constexpr):
    """Program (p, s): output columns p BLOCK_N .. + BLOCK_N (with SWIGLU, those gate rows and the
    up rows N further) over K columns s k_per_split .. + k_per_split, for every token tile."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    dtype = X_ptr.dtype.element_ty
    n = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    n_ok = n < N
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if HAS_BIAS:
        # the bias joins the first partial only: the consumer's sum adds it before its one rounding
        b = tl.load(B_ptr + n, mask=n_ok & (split == 0), other=0.0).to(tl.float32)
        if SWIGLU:
            b_up = tl.load(B_ptr + N + n, mask=n_ok, other=0.0).to(tl.float32)
    if PDL:  # x is the previous kernel's output
        gdc_launch_dependents()
        gdc_wait()
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)  # [BLOCK_T]
        t_ok = t < T
        acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
        if SWIGLU:
            acc_up = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < k_hi
            x = tl.load(X_ptr + t[:, None] * stride_x + k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            w_mask = n_ok[:, None] & k_ok[None, :]
            w = tl.load(W_ptr + n[:, None] * stride_w + k[None, :], mask=w_mask, other=0.0)  # [BLOCK_N, BLOCK_K]
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PREC)
            if SWIGLU:
                w_up = tl.load(W_ptr + (N + n)[:, None] * stride_w + k[None, :], mask=w_mask, other=0.0)
                acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision=DOT_PREC)
        if HAS_BIAS:
            acc += b[None, :]
        out_mask = t_ok[:, None] & n_ok[None, :]
        dst = Y_ptr + split * stride_ys + t[:, None] * stride_yt + n[None, :]
        if PARTIALS:
            tl.store(dst, acc, mask=out_mask)
        elif SWIGLU:
            if HAS_BIAS:
                acc_up += b_up[None, :]
            # gate and up rounded as the GEMM's output, silu rounded as its own op's output
            y = silu_mul_rounded(acc.to(dtype).to(tl.float32), acc_up.to(dtype).to(tl.float32), dtype)
            tl.store(dst, y.to(dtype), mask=out_mask)
        else:
            tl.store(dst, acc.to(dtype), mask=out_mask)


def _tiles(device: torch.device) -> _Tiles:
    return tiles_for(device, _TILES_CUDA, _TILES_INTERPRET)


def _rows_per_program(num_rows: int, num_splits: int, tiles: _Tiles, device: torch.device) -> int:
    """Rows of W a program owns: the most (up to tiles.max_rows) whose programs still give every
    multiprocessor tiles.programs_per_sm of them, at least tiles.min_rows."""
    target = tiles.programs_per_sm * (multiprocessor_count(device) if device.type == "cuda" else 1)
    rows = tiles.max_rows
    while rows > tiles.min_rows and triton.cdiv(num_rows, rows) * num_splits < target:
        rows //= 2
    return rows


def _check_args(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, swiglu: bool,
                splits: int) -> tuple[int, int, int]:
    """Validates the arguments; returns (T, K, N) with N the output width (half W's rows with SwiGLU)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or x.shape[1] < 1 or weight.shape[0] < 1:
        raise ValueError(f"{name}: x must be [T, K] and weight [N, K] with K >= 1; got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"{name}: x, weight and bias must share one dtype; got {x.dtype}, {weight.dtype}"
                         f"{'' if bias is None else ', ' + str(bias.dtype)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{name}: bias must be [N = {weight.shape[0]}]; got {tuple(bias.shape)}")
    if splits < 1 or (swiglu and splits != 1):
        raise ValueError(f"{name}: splits must be >= 1, and 1 with swiglu; got splits={splits}, swiglu={swiglu}")
    if swiglu and weight.shape[0] % 2:
        raise ValueError(f"{name}: swiglu needs weight = [W_gate; W_up], an even row count; got {weight.shape[0]}")
    return x.shape[0], x.shape[1], weight.shape[0] // 2 if swiglu else weight.shape[0]


def _k_per_split(K: int, splits: int, block_k: int) -> int:
    """K columns of each split: a multiple of block_k (the last split takes what is left)."""
    return triton.cdiv(triton.cdiv(K, splits), block_k) * block_k


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, swiglu: bool = False,
                  splits: int = 1, pdl: bool = False, impl: str = "triton") -> torch.Tensor:
    """x @ weight.T (+ bias) for few tokens (module docstring): rounded once, SwiGLU'd, or as partial sums.

    Args:
        x: [T, K] bf16/fp16/fp32, last dim contiguous (rows may be strided).
        weight: [N, K] in x's dtype, last dim contiguous; with swiglu [W_gate; W_up], [2 N, K].
        bias: [N] (with swiglu [2 N]) in x's dtype, or None.
        swiglu: return silu(gate) * up, [T, N], each rounded where the plain path rounds.
        splits: > 1 returns fp32 partial sums [splits', T, N] over splits of K, the bias in the first
            (splits' = cdiv(K, c) <= splits for c = `_k_per_split`: whole K tiles a split). Not with swiglu.
        pdl: launch with programmatic dependent launch (`common.pdl_available` devices).
        impl: "triton" (CUDA, or CPU under TRITON_INTERPRET=1) or "eager".

    Returns:
        [T, N] in x's dtype, or [splits', T, N] fp32 with splits > 1; contiguous.
    """
    check_impl("skinny_linear", impl)
    if impl == "eager":
        return skinny_linear_eager(x, weight, bias, swiglu=swiglu, splits=splits, pdl=pdl)
    T, K, N = _check_args("skinny_linear", x, weight, bias, swiglu, splits)
    check_triton_operands("skinny_linear", x, weight, *(() if bias is None else (bias,)))
    check_pdl("skinny_linear", pdl, x.device)
    tiles = _tiles(x.device)
    k_per_split = _k_per_split(K, splits, tiles.block_k)
    num_splits = triton.cdiv(K, k_per_split)
    partials = splits > 1
    if partials:
        out = torch.empty((num_splits, T, N), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((T, N), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    rows = _rows_per_program(N, num_splits, tiles, x.device)
    _skinny_linear_kernel[(triton.cdiv(N, rows), num_splits)](
        x, weight, x if bias is None else bias, out, T, K, N, k_per_split,
        x.stride(0), weight.stride(0), out.stride(0) if partials else 0, out.stride(-2),
        HAS_BIAS=bias is not None, SWIGLU=swiglu, PARTIALS=partials,
        BLOCK_T=min(max(16, triton.next_power_of_2(T)), _MAX_TOKEN_TILE), BLOCK_N=rows, BLOCK_K=tiles.block_k,
        DOT_PREC=dot_precision(x.dtype), PDL=pdl,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_launch(pdl),
    )
    return out


def skinny_linear_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                        swiglu: bool = False, splits: int = 1, pdl: bool = False, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments and result as `skinny_linear`; ``pdl``, a launch option,
    changes nothing here): F.linear, silu_mul, or one fp32 matmul per split of K, the splits cut
    as the kernel cuts them."""
    check_eager_impl("skinny_linear_eager", impl)
    _check_args("skinny_linear_eager", x, weight, bias, swiglu, splits)
    if splits == 1:
        y = F.linear(x, weight, bias)
        return silu_mul_eager(*y.chunk(2, dim=-1)) if swiglu else y.contiguous()
    c = _k_per_split(x.shape[1], splits, _tiles(x.device).block_k)
    out = torch.stack([xs.float() @ ws.float().T for xs, ws in zip(x.split(c, 1), weight.split(c, 1))])
    if bias is not None:
        out[0] += bias.float()
    return out
