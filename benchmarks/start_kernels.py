"""The two decode kernels as they were at commit 22e84bc, frozen here as benchmark peers.

`start_sample_from_logits`: one program per row, the top-k / top-p thresholds found by repeated
pivot searches over the row (4-8 sweeps). `start_paged_decode_attention`: the paged flash-decoding
kernel with its first tile and split choices. Only the Triton paths, no argument checks: the
benchmarks call them with the same valid inputs as the current kernels. Not part of the package;
do not edit (they are the "before" of the benchmark tables).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# ----------------------------------------------------------------------------- sampler

# finite stand-in for -inf (the sampler's all -inf prefix max, the attention walk's masked scores)
_NEG_BIG = tl.constexpr(-1.0e30)
_INF = tl.constexpr(float("inf"))
_LOG2E_S = 1.4426950408889634

# Pivots per search pass (their sum must be a power of two: one tl.arange covers them).
_NUM_VALUE_PIVOTS = 6
_NUM_KEY_PIVOTS = 2
# Bit-pattern bisection splits the bracket into _NUM_KEY_PIVOTS + 1 parts per pass, so 32 bits
# take at most ceil(32 / log2(3)) + 1 = 22 passes; the cap only ends NaN rows.
_MAX_PASSES = 24
# Picked on an H200 among 1024-4096 x 4-16 warps x 4-16 pivots (B 64-1024, V = 151936, bf16).
_BLOCK_CUDA, _NUM_WARPS_CUDA = 4096, 8
# The draw reduces once per chunk (it must find the crossing chunk in order), so its chunks are
# wider: fewer serial steps per row.
_DRAW_BLOCK_CUDA = 16384


@triton.jit
def _pivots(lo, hi, NV: tl.constexpr, NK: tl.constexpr):
    """[NV + NK] fp32 pivots in [lo, hi]: NV evenly spaced in value, NK in the bit pattern."""
    j = tl.arange(0, NV + NK)
    lo_v = tl.full([NV + NK], 0.0, tl.float32) + lo
    hi_v = tl.full([NV + NK], 0.0, tl.float32) + hi
    f = (j + 1).to(tl.float32) / (NV + 1)
    by_value = lo_v * (1.0 - f) + hi_v * f  # never overflows, unlike lo + (hi - lo) * f
    # fp32 <-> int32 keys of the same order: negatives get their magnitude bits flipped.
    blo = lo_v.to(tl.int32, bitcast=True)
    bhi = hi_v.to(tl.int32, bitcast=True)
    klo = tl.where(blo >= 0, blo, blo ^ 0x7FFFFFFF).to(tl.int64)
    khi = tl.where(bhi >= 0, bhi, bhi ^ 0x7FFFFFFF).to(tl.int64)
    k = (klo + (khi - klo) * (j - NV + 1) // (NK + 1)).to(tl.int32)
    by_key = tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    return tl.where(j < NV, by_value, by_key)


@triton.jit
def _search_pass(row_ptr, V, m, c2, hi, piv, MASS: tl.constexpr, BLOCK: tl.constexpr):
    """One pass: sum over x < hi of W(x >= pivot) for each pivot, and the largest value
    v1 < hi with its weight and count.

    The loop is elementwise only: every lane keeps its own sums and its own (max, weight, count)
    and the pass reduces them once at the end, so chunks do not wait on cross-warp reductions.
    """
    acc = tl.zeros([piv.shape[0], BLOCK], tl.float32)
    lane_max = tl.full([BLOCK], -float("inf"), tl.float32)
    lane_w = tl.zeros([BLOCK], tl.float32)
    lane_c = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        below = x < hi
        if MASS:
            # Every pass writes a weight as exp2((x - m) * c2), the same expression, so a
            # value's weight is bit-identical in every pass and the bracket stays consistent.
            w = tl.where(below, tl.exp2((x - m) * c2), 0.0)
        else:
            w = below.to(tl.float32)
        acc += tl.where(x[None, :] >= piv[:, None], w[None, :], 0.0)
        xb = tl.where(below, x, -float("inf"))
        gt = xb > lane_max
        eq = xb == lane_max
        lane_w = tl.where(gt, w, tl.where(eq, lane_w + w, lane_w))
        lane_c = tl.where(gt, 1.0, tl.where(eq, lane_c + 1.0, lane_c))
        lane_max = tl.maximum(lane_max, xb)
    v1 = tl.max(lane_max, 0)
    # Lanes still at -inf never match a v1 >= lo, the only v1 the caller uses.
    top = lane_max == v1
    return tl.sum(acc, 1), v1, tl.sum(tl.where(top, lane_w, 0.0), 0), tl.sum(tl.where(top, lane_c, 0.0), 0)


@triton.jit
def _select(row_ptr, V, m, c2, lo, target, MASS: tl.constexpr, NV: tl.constexpr,
            NK: tl.constexpr, BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """The largest data value t with W(x >= t) >= target, given W(x >= lo) >= target.

    Returns t, W(x > t), count(x == t), W(x == t).
    """
    hi = _INF
    w_hi = 0.0  # W(x >= hi)
    t = lo
    above = 0.0
    count = 0.0
    w_t = 0.0
    it = 0
    done = 0
    while done == 0:
        piv = _pivots(lo, tl.minimum(hi, m), NV, NK)
        acc, v1, w1, c1 = _search_pass(row_ptr, V, m, c2, hi, piv, MASS, BLOCK)
        it += 1
        # v1 <= lo: the bracket holds one value (or fp32 round-off emptied it); the cap ends NaN rows.
        if (w_hi + w1 >= target) | (v1 <= lo) | (it >= MAX_PASSES):
            t = v1
            above = w_hi
            count = c1
            w_t = w1
            done = 1
        else:
            W = w_hi + acc
            ok = W >= target  # W is monotone in the pivot, so ok pivots all lie below the others
            lo = tl.maximum(lo, tl.max(tl.where(ok, piv, -_INF), 0))
            hi_piv = tl.min(tl.where(ok, _INF, piv), 0)
            w_hi_piv = tl.max(tl.where(ok, -1.0, W), 0)
            # v1 failed: W(x >= v1) = w_hi + w1 < target, so v1 is a valid upper end too.
            w_hi = tl.where(v1 < hi_piv, w_hi + w1, w_hi_piv)
            hi = tl.minimum(v1, hi_piv)
    return t, above, count, w_t


@triton.jit
def _kept_weight(x, m, c2, t, num_ties, ties_before, PARTIAL: tl.constexpr):
    """Weights of the kept tokens of one chunk (0 elsewhere): x > t, plus the first `num_ties`
    tokens tied at t in vocabulary order when PARTIAL."""
    eq = x == t
    if PARTIAL:
        eq_i = eq.to(tl.int32)
        rank = ties_before + tl.cumsum(eq_i, 0) - eq_i  # tied tokens before this one in the row
        kept = (x > t) | (eq & (rank < num_ties))
    else:
        kept = x >= t
    return tl.where(kept, tl.exp2((x - m) * c2), 0.0), tl.sum(eq.to(tl.int32), 0)


@triton.jit
def _inverse_cdf(row_ptr, V, m, c2, t, num_ties, target, PARTIAL: tl.constexpr,
                 BLOCK: tl.constexpr):
    """The first index whose running kept mass exceeds target; if fp32 round-off leaves every
    running sum <= target, the last kept index of positive mass."""
    acc = 0.0
    ties = 0
    last = -1
    v0 = 0
    found = 0
    while (found == 0) & (v0 < V):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        w, num_eq = _kept_weight(x, m, c2, t, num_ties, ties, PARTIAL)
        s = tl.sum(w, 0)
        if acc + s > target:
            found = 1
        else:
            acc += s
            ties += num_eq
            last = tl.maximum(last, tl.max(tl.where(w > 0.0, offs, -1), 0))
            v0 += BLOCK
    token = last
    if found != 0:
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        w, _ = _kept_weight(x, m, c2, t, num_ties, ties, PARTIAL)
        # A parallel scan rounds each prefix on its own, so the prefix sums need not be monotone:
        # one can step above target at a dropped token (w = 0). Only kept tokens may be drawn.
        first = tl.min(tl.where((acc + tl.cumsum(w, 0) > target) & (w > 0.0), offs, V), 0)
        # The chunk's prefix sums can round below its tl.sum: then its last positive index.
        token = tl.where(first < V, first, tl.max(tl.where(w > 0.0, offs, -1), 0))
    return tl.maximum(token, 0)


@triton.jit
def _sample_kernel(
    X_ptr, U_ptr, Out_ptr, V, stride_xb, c2, top_k, top_p,
    TOP_K: tl.constexpr, TOP_P: tl.constexpr, NV: tl.constexpr, NK: tl.constexpr,
    BLOCK: tl.constexpr, DRAW_BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = X_ptr + row.to(tl.int64) * stride_xb  # int64: B * stride overflows int32

    # Pass 1: the max (and the finite range for top-k), lane by lane, reduced once.
    lane_max = tl.full([BLOCK], _NEG_BIG, tl.float32)
    lane_min = tl.full([BLOCK], float("inf"), tl.float32)
    lane_fin = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        lane_max = tl.maximum(lane_max, x)
        if TOP_K:
            fin = x > -float("inf")
            lane_min = tl.minimum(lane_min, tl.where(fin, x, float("inf")))
            lane_fin += fin.to(tl.float32)
    m = tl.max(lane_max, 0)

    t = -_INF  # kept: x > t, plus num_ties tokens tied at t (all of them unless partial)
    num_kept = V * 1.0
    if TOP_K:
        k = tl.minimum(top_k * 1.0, tl.sum(lane_fin, 0))
        kth, above, count, _ = _select(row_ptr, V, m, c2, tl.min(lane_min, 0), k, False, NV, NK,
                                       BLOCK, MAX_PASSES)
        t = kth
        num_kept = above + count
    # The kept mass so far: sum of exp over x >= t.
    lane_s = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        lane_s += tl.where(x >= t, tl.exp2((x - m) * c2), 0.0)
    total = tl.sum(lane_s, 0)

    u = tl.load(U_ptr + row)
    if TOP_P:
        target = top_p * total
        # mass(x < lo) <= num_kept * e(lo) = (1 - top_p) * total / 2, so W(x >= lo) >= target.
        lo = tl.maximum(t, m + tl.log2(0.5 * (1.0 - top_p) * total / num_kept) / c2)
        tp, above, count, w_t = _select(row_ptr, V, m, c2, lo, target, True, NV, NK, BLOCK,
                                        MAX_PASSES)
        e_t = tl.exp2((tp - m) * c2)
        # The official rule keeps a tied token while the mass sorted above it is < target.
        num_ties = tl.minimum(tl.maximum(tl.ceil((target - above) / e_t), 1.0), count)
        kept_mass = tl.where(num_ties == count, above + w_t, above + num_ties * e_t)
        if num_ties < count:
            token = _inverse_cdf(row_ptr, V, m, c2, tp, num_ties.to(tl.int32), u * kept_mass,
                                 True, DRAW_BLOCK)
        else:
            token = _inverse_cdf(row_ptr, V, m, c2, tp, 0, u * kept_mass, False, DRAW_BLOCK)
    else:
        token = _inverse_cdf(row_ptr, V, m, c2, t, 0, u * total, False, DRAW_BLOCK)
    tl.store(Out_ptr + row, tl.minimum(token, V - 1).to(tl.int64))


def start_sample_from_logits(logits: torch.Tensor, uniform: torch.Tensor, *, temperature: float = 1.0,
                             top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """tokens [B] int64 from logits [B, V] (CUDA) and uniform [B] fp32, as at commit 22e84bc."""
    B, V = logits.shape
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    _sample_kernel[(B,)](
        logits, uniform, tokens, V, logits.stride(0), _LOG2E_S / temperature, top_k, top_p,
        TOP_K=0 < top_k < V, TOP_P=top_p < 1.0, NV=_NUM_VALUE_PIVOTS, NK=_NUM_KEY_PIVOTS,
        BLOCK=_BLOCK_CUDA, DRAW_BLOCK=_DRAW_BLOCK_CUDA, MAX_PASSES=_MAX_PASSES,
        num_warps=_NUM_WARPS_CUDA,
    )
    return tokens


# ----------------------------------------------------------------------------- paged attention

_LOG2E = 1.4426950408889634
# Stage 1 aims for this many programs per multiprocessor: decode is memory-bound, and several
# resident programs per SM keep enough loads in flight.
_PROGRAMS_PER_SM = 4
_MAX_SPLITS = 32


@dataclass(frozen=True)
class _Tiles:
    """Tile size of the key/value walk, the shortest split worth a program, launch shape."""

    block_n: int
    min_split_tokens: int
    num_warps: int
    num_stages: int


_TILES_CUDA = _Tiles(block_n=64, min_split_tokens=512, num_warps=4, num_stages=2)
# The interpreter gets small tiles and short splits, so small test shapes cross tiles and splits.
_TILES_INTERPRET = _Tiles(block_n=16, min_split_tokens=32, num_warps=1, num_stages=1)
# The interpreter has no SM count; this stands in for the number of programs to aim for.
_INTERPRET_TARGET_PROGRAMS = 8


@triton.jit
def _paged_decode_split_kernel(
    Q_ptr, K_ptr, V_ptr, BT_ptr, CL_ptr, O_ptr, M_ptr, L_ptr,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_btb, stride_ob, stride_oh, stride_os,
    qk_scale, G, num_splits,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.program_id(2)
    n_ctx = tl.load(CL_ptr + b)
    # This split's share of the sequence, whole tiles: splits past the context stay empty.
    per_split = tl.cdiv(tl.cdiv(n_ctx, num_splits), BLOCK_N) * BLOCK_N
    start = s * per_split
    end = tl.minimum(start + per_split, n_ctx)

    g = tl.arange(0, BLOCK_G)
    g_ok = g < G  # rows past the group are padding of the dot tile
    heads = h * G + g
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None], other=0.0)
    bt_row = BT_ptr + b * stride_btb
    k_head = K_ptr + h * stride_kh
    v_head = V_ptr + h * stride_vh

    m = tl.full((BLOCK_G,), _NEG_BIG, tl.float32)
    l = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        ok = tok < end
        # Masked: table entries and pool slots past the context are never read (they may hold
        # stale ids and NaN).
        blk = tl.load(bt_row + tok // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        slot = (tok % BLOCK_SIZE).to(tl.int64)
        k = tl.load(k_head + blk[:, None] * stride_kb + slot[:, None] * stride_kt + d[None, :],
                    mask=ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # (BLOCK_G, BLOCK_N)
        qk = tl.where(ok[None, :], qk, _NEG_BIG)
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_head + blk[:, None] * stride_vb + slot[:, None] * stride_vt + d[None, :],
                    mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m = m_new

    if SPLIT:
        # Unnormalised partials: an empty split (l = 0) stays 0 instead of 0 / 0.
        ms_off = (b * (G * tl.num_programs(1)) + heads) * num_splits + s
        tl.store(M_ptr + ms_off, tl.where(l > 0, m, float("-inf")), mask=g_ok)
        tl.store(L_ptr + ms_off, l, mask=g_ok)
        tl.store(O_ptr + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + d[None, :],
                 acc, mask=g_ok[:, None])
    else:
        # One split covers the whole context, which holds at least one token: l > 0.
        out = acc / l[:, None]
        tl.store(O_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(O_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def _paged_decode_combine_kernel(
    W_ptr, M_ptr, L_ptr, Out_ptr, stride_outb, stride_outh, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    row = b * tl.num_programs(1) + hq
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    m = tl.load(M_ptr + row * num_splits + s, mask=s_ok, other=float("-inf"))
    l = tl.load(L_ptr + row * num_splits + s, mask=s_ok, other=0.0)
    # Split 0 always holds the first token, so m_all is finite and empty splits weigh
    # exp2(-inf) = 0.
    m_all = tl.max(m, 0)
    w = tl.exp2(m - m_all)
    d = tl.arange(0, HEAD_DIM)
    o = tl.load(W_ptr + (row * num_splits + s)[:, None] * HEAD_DIM + d[None, :],
                mask=s_ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w * l, 0)
    tl.store(Out_ptr + b * stride_outb + hq * stride_outh + d, out.to(Out_ptr.dtype.element_ty))


def _tiles(device: torch.device) -> _Tiles:
    return _TILES_CUDA if device.type == "cuda" else _TILES_INTERPRET


def _num_splits(B: int, Hkv: int, max_tokens: int, tiles: _Tiles, device: torch.device) -> int:
    """Splits of stage 1 from shapes only: fill the GPU, never below `min_split_tokens` a split."""
    if device.type == "cuda":
        target = _PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = _INTERPRET_TARGET_PROGRAMS
    by_load = triton.cdiv(target, max(B * Hkv, 1))
    by_length = max(1, max_tokens // tiles.min_split_tokens)
    return max(1, min(by_load, by_length, _MAX_SPLITS))


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
            num_splits: int | None) -> torch.Tensor:
    """Runs stage 1 (and stage 2 with more than one split); returns out [B, Hq, D] in q's dtype."""
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if B == 0:
        return out
    tiles = _tiles(q.device)
    S = num_splits or _num_splits(B, Hkv, block_tables.shape[1] * block_size, tiles, q.device)
    if S > 1:
        work = torch.empty((B, Hq, S, D), dtype=torch.float32, device=q.device)
        m, l = (torch.empty((B, Hq, S), dtype=torch.float32, device=q.device) for _ in range(2))
        dst, dst_strides = work, (work.stride(0), work.stride(1), work.stride(2))
    else:
        m = l = out  # unused: stage 1 writes the output directly
        dst, dst_strides = out, (out.stride(0), out.stride(1), 0)
    _paged_decode_split_kernel[(B, Hkv, S)](
        q, k_cache, v_cache, block_tables, context_lens, dst, m, l,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), *dst_strides,
        scale * _LOG2E, G, S,
        BLOCK_SIZE=block_size, HEAD_DIM=D, BLOCK_G=max(16, triton.next_power_of_2(G)),
        BLOCK_N=tiles.block_n, SPLIT=S > 1,
        # fp32 inputs get a true fp32 dot (tf32 would cost ~1e-3 relative error).
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if S > 1:
        _paged_decode_combine_kernel[(B, Hq)](
            work, m, l, out, out.stride(0), out.stride(1), S,
            HEAD_DIM=D, BLOCK_S=triton.next_power_of_2(S), num_warps=1,
        )
    return out


def start_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """out [B, Hq, D] of one decode step over a paged pool (CUDA), as at commit 22e84bc."""
    return _launch(q, k_cache, v_cache, block_tables, context_lens, q.shape[2] ** -0.5, None)
