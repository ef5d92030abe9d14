"""Exact temperature / top-k / top-p sampling from [B, V] logits in two sweeps over the vocabulary.

The math this file replaces, as eager code (the official rule, reference 4.2, and
`oreal_fast.rollout.sampling.sample_next_token`):

    z = logits.float() / temperature                                     # [B, V]
    z = z.masked_fill(z < z.topk(top_k).values[:, -1:], -inf)            # top-k, ties with the k-th kept
    s, order = z.sort(ascending)                                         # top-p: the sort this file removes
    drop = s.softmax(-1).cumsum(-1) <= 1 - top_p; drop[:, -1] = False    # the smallest top set reaching top_p
    token = multinomial(z.masked_fill(drop scattered back, -inf).softmax(-1))

The token is drawn by inverse CDF from one caller-made uniform u per row: the first index i, in
vocabulary order, whose running kept mass exceeds u * kept_mass. Weights are
e(x) = exp2((x - m) * c2) with m the row max and c2 = log2(e) / temperature. The kept set is
"x > t, plus the first n tokens tied at t in vocabulary order" for a threshold t found without
sorting. Four kernels, the row cut into chunks of `chunk` tokens:

1. stats, grid (B, chunks), sweep 1: per chunk its max m_c, mass s_c = sum e(x) relative to m_c,
   and a histogram of token depth below m_c (in units of 1 / units_per_log2 of a log2 weight
   unit) over `num_bins` bins whose width doubles every `bins_per_doubling` bins: fine near the
   top, 64 log2 units (44 nats) deep on CUDA (deeper tokens are counted nowhere; their mass is
   in s_c).
2. plan, grid (B,): merges the chunk histograms at the row max (linear within a chunk's bins),
   models each bin's density as log-linear in depth (slope from its neighbours), scales the bin
   masses to the exact row mass S, and estimates where the cumulative mass from the top crosses
   top_p * S (or, for top-k, where the count crosses k). It then picks a bracket [L, U) of values
   holding about `budget` tokens on each side of that estimate (for top-k: [L, inf) holding k +
   budget tokens). The bracket is only a guess; nothing below relies on it being right.
3. compact, grid (B, chunks), sweep 2: per chunk the exact mass of its tokens x >= U, and every
   token in [L, U) appended (value, index) to the row's buffer of `cap` slots.
4. draw, grid (B,): the exact threshold from the buffer (a search on the fp32 bit pattern, so
   ties are whole values), the number of tied tokens the official rule keeps and the index of
   the last one kept, and then a check that the bracket held the threshold: for top-p,
   mass(x >= U) < top_p * S <= mass(x >= L); for top-k, at least k tokens buffered; no
   overflow. If the check holds, the chunk holding the draw follows from the per-chunk masses
   (x >= U) plus the buffered kept tokens, and one scan of that chunk finds the token. If not,
   the program runs the search-based sampler on its row (several more sweeps: `_search_token`),
   which needs no bracket. With neither filter, plan and compact do not run and draw picks the
   chunk from s_c. The three searches (threshold key, tie index, chunk) are multi-way: a pass
   evaluates `draw_pivots` pivots in one reduction and keeps the part between two of them; the
   key and index searches start from the buffered keys' (indices') own range and snap both ends
   to buffered values after each pass, so they end when one value is left (bf16 keys are
   multiples of 2^16 apart: a few dozen buffered values take two passes).

Log-probs (`sample_with_logprobs`): each token's log-prob under the model's unmodified
distribution, log_softmax(logits.float())[token] at temperature 1 before any filter: the
distribution the trainer's log-probs are taken under (reference 4.9, no temperature in training).
Sweep 1 already sums each chunk's mass relative to its max; at temperature 1 that sum is the
log-sum-exp's, and otherwise sweep 1 sums exp2((x - m_c) * log2(e)) beside it (one more exp2 a
token). The draw kernel combines the chunks' sums into the row's log-sum-exp and reads the
token's logit: no extra sweep. Greedy decoding has no sampler sweep; `token_logprobs` reads its
rows once more (one program a row, an online log-sum-exp).

Invariant: for continuous logits the token is `sample_from_logits_eager`'s, except where u *
kept_mass or the top-p mass lies within fp32 round-off of a boundary; as a distribution it is the
official one, whichever path a row takes (`_sample` reports which).

Budget (B rows of V logits, bf16 in the engine): sweeps 1 and 2 each read the logits once; per
token, sweep 1 does one exp2 and a histogram update (about 40 instructions per 32 tokens for 64
bins), sweep 2 one exp2, two compares and, for chunks holding bracket tokens, a prefix sum.
Draw reads the buffered tokens (at most `cap` per row, 8 bytes each) and one chunk of logits.
Plan and draw run one program per row, so at small B their latency is their chains of block-wide
reductions: plan reads each chunk's histogram once at the NB bin edges ([chunks, NB] gathers) and
needs about 10 reductions; draw about 20 for a bf16 top-p row (two passes of two reductions for
the key, about three for the tie index, two of two for the chunk, the scan), each pass's pivot
test costing draw_pivots x cap compares.
All sums, maxima and masses are fp32; counts are exact in fp32 below 2^24 > V. Allocated per call:
[B, chunks] fp32 statistics, [B, chunks, num_bins] int32 histograms, [B, cap] fp32 values and
int32 indices (16 MiB at B = 256 on CUDA), the [B] int64 output: no [B, V] tensor, no host sync,
no allocation that depends on data, so the call can be captured in a CUDA graph. Log-probs add
the [B] fp32 output, and at temperature != 1 one more [B, chunks] fp32 sum (19 KiB at B = 256);
the draw kernel reads chunks x 8 bytes and one logit more per row. `token_logprobs` reads the
[B, V] logits once (B x V x 2 bytes in bf16: 78 MB at B = 256) and writes [B] fp32.

Limits: the fallback costs a few sweeps of one row by one program (tens of microseconds); it runs
where the bracket misses (heavy-tailed rows whose kept set is most of V), where top-k keeps more
than `cap - budget` tokens or its k-th token lies deeper than the histogram, and on rows with
fewer than k finite logits. Ties are decided on the
logits as given, before the temperature (the official code divides first; for bf16/fp16 logits the
order is the same, for fp32 logits the division can merge neighbours 1 ulp apart). -0.0 and +0.0
are one value. Logits must be finite or -inf (NaN or +inf rows give an unspecified token in
[0, V)). On CPU the Triton path runs only under TRITON_INTERPRET=1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

IMPLS = ("triton", "eager")

_LOG2E = 1.4426950408889634
_LOG2E_TL = tl.constexpr(_LOG2E)
_LN2_TL = tl.constexpr(0.6931471805599453)
_NEG_BIG = tl.constexpr(-1.0e30)  # finite stand-in for the max of an all -inf prefix
_INF = tl.constexpr(float("inf"))
# Depths past this (in fine units) are "beyond the histogram": it keeps exp2 and the bit tricks finite.
_DEEP = tl.constexpr(1.0e9)
# Slopes of the log-linear bin densities are clamped here (log2 units of density per log2 unit of
# depth): steep enough for any real row, small enough that exp2((slope + 1) * bin width) stays
# finite in fp32 for the widest bin (4 log2 units on CUDA).
_MAX_SLOPE = tl.constexpr(16.0)


@dataclass(frozen=True)
class _Config:
    """Shapes of the two-sweep sampler (see the module docstring)."""

    chunk: int  # vocabulary entries per program of sweeps 1 and 2 (a power of two)
    num_bins: int  # histogram bins per chunk, the last one unused (a power of two >= 32)
    bins_per_doubling: int  # a power of two
    budget: int  # tokens on each side of the estimated threshold that the bracket aims to hold
    cap: int  # buffered tokens per row (a power of two)
    # fine depth units (the width of the top bins) per log2 unit of weight; the histogram reaches
    # bins_per_doubling * (2^(num_bins / bins_per_doubling) - 1) units deep
    units_per_log2: float
    sweep_warps: int
    plan_warps: int
    draw_warps: int
    # pivots per pass of the draw kernel's multi-way searches (a power of two): each pass is one
    # [draw_pivots, cap] reduction and narrows its range (of keys, tie indices or chunks) to
    # 1 / (draw_pivots + 1)
    draw_pivots: int

    @property
    def log2_bins_per_doubling(self) -> int:
        return self.bins_per_doubling.bit_length() - 1


def _chunks_pad(num_chunks: int) -> int:
    """The per-row chunk vectors' padded width (a power of two, at least 2)."""
    return max(2, triton.next_power_of_2(num_chunks))


# Picked for V = 151936 in bf16 from a study of the bracket on synthetic rows (normal with spread
# 0.1-6, Zipf, Gumbel, a few tokens far above the rest; top-p 0.5-0.99, temperature 0.7-1.3): the
# estimate is usually within ~100 tokens, up to a few thousand on flat heavy-tailed rows; with 64
# bins and 2000 tokens a side, 1 row in 320 fell back (32 bins: about one in 6 of the hardest).
# The buffer's keys, indices and weights must fit in registers: 8192 slots take 96 KiB.
# draw_warps and draw_pivots from benchmarks/sweep_sampling.py on an H100: 8 warps and 4 pivots drew
# fastest at batch 1 and 256 among {8, 16} x {4, 8, 16} (benchmarks/RESULTS.md)
_CUDA = _Config(chunk=8192, num_bins=64, bins_per_doubling=8, budget=2000, cap=8192,
                units_per_log2=32.0, sweep_warps=8, plan_warps=4, draw_warps=8, draw_pivots=4)
# The interpreter gets a small buffer and a narrow bracket (24 tokens a side), so the CPU tests
# check the estimate as well as the exact parts.
_INTERPRET = _Config(chunk=0, num_bins=64, bins_per_doubling=8, budget=24, cap=128,
                     units_per_log2=32.0, sweep_warps=1, plan_warps=1, draw_warps=1, draw_pivots=4)
# The interpreter cuts each row into about this many chunks, whatever V: the CPU tests cross
# chunk boundaries at every V and stay fast.
_INTERPRET_CHUNKS = 4

# The fallback search (`_search_token`): pivots per pass (their sum a power of two: one tl.arange
# covers them), and the bit-pattern bisection's bound: it splits the bracket into
# _NUM_KEY_PIVOTS + 1 parts per pass, so 32 bits take at most ceil(32 / log2(3)) + 1 = 22 passes;
# the cap only ends NaN rows.
_NUM_VALUE_PIVOTS = 6
_NUM_KEY_PIVOTS = 2
_MAX_PASSES = 24
_SEARCH_BLOCK_CUDA = 4096
# Its draw reduces once per block (it must find the crossing block in order), so blocks are wider.
_SEARCH_DRAW_BLOCK_CUDA = 16384
# Eager twin: rows per chunk so that one fp64 [rows, V] tensor holds about this many elements.
_EAGER_CHUNK_ELEMS = 2**22


# ----------------------------------------------------------------------------- shared helpers


@triton.jit
def _key(x):
    """int32 keys of fp32 x with the same order (-0.0 and +0.0 share the key of +0.0)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _value(key):
    """The fp32 value of an int32 key of `_key` (the map is its own inverse)."""
    return tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _bin(depth, NB: tl.constexpr, LP: tl.constexpr):
    """Histogram bin of a depth >= 0 (fine units): bins 0 .. 2^LP - 1 are one unit wide, then
    each run of 2^LP bins is twice as wide as the one before; NB - 1 collects the rest (and NaN).

    The bin is read off the fp32 bit pattern of depth + 2^LP: exponent and top LP mantissa bits.
    """
    d = tl.where(depth < _DEEP, depth, _DEEP) + (1 << LP)
    j = (d.to(tl.int32, bitcast=True) >> (23 - LP)) - ((127 + LP) << LP)
    return tl.minimum(tl.maximum(j, 0), NB - 1)


@triton.jit
def _edge(j, LP: tl.constexpr):
    """Depth (fine units, fp32) of the top edge of bin j (j >= 0; j = NB is the bottom of NB - 1)."""
    per = 1 << LP
    return (((per + (j & (per - 1))) << (j >> LP)) - per).to(tl.float32)


# ----------------------------------------------------------------------------- fallback search


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
    """The largest data value t with W(x >= t) >= target, given W(x >= lo) >= target, where W
    is a count (MASS false) or the mass exp2((x - m) * c2).

    Each pass evaluates W at value- and bit-pattern-spaced pivots in the bracket [lo, hi) and
    "peels" the largest value v1 below hi: if W(x >= hi) + W(x == v1) >= target, v1 is the
    answer, exactly. Returns t, W(x > t), count(x == t), W(x == t).
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
    """Weights of the kept tokens of one block (0 elsewhere): x > t, plus the first `num_ties`
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
        # The block's prefix sums can round below its tl.sum: then its last positive index.
        token = tl.where(first < V, first, tl.max(tl.where(w > 0.0, offs, -1), 0))
    return tl.maximum(token, 0)


@triton.jit
def _search_token(row_ptr, V, u, c2, top_k, top_p, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
                  NV: tl.constexpr, NK: tl.constexpr, BLOCK: tl.constexpr,
                  DRAW_BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """The token of one row by threshold searches over the whole row (no bracket needed):
    the row max, the k-th value by `_select` on counts, the kept mass, the top-p threshold by
    `_select` on masses, the inverse CDF. About 4-8 sweeps of the row."""
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
    lane_s = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        lane_s += tl.where(x >= t, tl.exp2((x - m) * c2), 0.0)
    total = tl.sum(lane_s, 0)
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
    return token


# ----------------------------------------------------------------------------- sweep 1: stats


@triton.jit
def _stats_kernel(
    X_ptr, Mc_ptr, Sc_ptr, S1_ptr, Cum_ptr, Cnt_ptr, V, stride_xb, num_chunks, c2, c2r,
    NB: tl.constexpr, LP: tl.constexpr, CHUNK: tl.constexpr, UNIT_MASS: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    x = tl.load(X_ptr + row.to(tl.int64) * stride_xb + offs, mask=ok,
                other=-float("inf")).to(tl.float32)
    m_c = tl.max(x, 0)
    ref = tl.where(m_c > -float("inf"), m_c, 0.0)  # an all -inf chunk: mass 0, no depths
    s_c = tl.sum(tl.exp2((x - ref) * c2), 0)
    j = _bin((ref - x) * c2r, NB, LP)
    hist = tl.histogram(j, NB, mask=ok & (j < NB - 1))
    slot = row * num_chunks + c
    tl.store(Cum_ptr + slot.to(tl.int64) * NB + tl.arange(0, NB), tl.cumsum(hist, 0))
    tl.store(Mc_ptr + slot, m_c)
    tl.store(Sc_ptr + slot, s_c)
    if UNIT_MASS:
        # the mass at temperature 1 for the log-probs (at temperature 1 it is s_c itself)
        tl.store(S1_ptr + slot, tl.sum(tl.exp2((x - ref) * _LOG2E_TL), 0))
    if c == 0:
        tl.store(Cnt_ptr + row, 0)  # the buffer count that sweep 2 appends to (stream order)


# ----------------------------------------------------------------------------- plan


@triton.jit
def _count_above(cum_row, c, c_ok, shift, e, NB: tl.constexpr, LP: tl.constexpr):
    """Estimated tokens of the row above depth e ([N] fine units below the row max): each chunk's
    cumulative histogram read at depth e - shift_c, linear within its bin."""
    depth = e[None, :] - shift[:, None]  # (C, N): the same depth below each chunk's max
    live = c_ok[:, None] & (depth > 0)
    j = _bin(depth, NB, LP)
    base = cum_row + c[:, None] * NB
    hi = tl.load(base + j, mask=live, other=0).to(tl.float32)
    lo = tl.load(base + j - 1, mask=live & (j > 0), other=0).to(tl.float32)
    e0 = _edge(j, LP)
    frac = tl.minimum(tl.maximum((depth - e0) / (_edge(j + 1, LP) - e0), 0.0), 1.0)
    return tl.sum(tl.where(live, lo + (hi - lo) * frac, 0.0), 0)


@triton.jit
def _ramp(g, v):
    """integral_0^v 2^(g s) ds, elementwise; stable near g = 0."""
    gv = g * v
    small = tl.abs(gv) < 1e-3
    g_safe = tl.where(small, 1.0, g)
    return tl.where(small, v * (1.0 + 0.34657359 * gv), (tl.exp2(gv) - 1.0) / (g_safe * 0.69314718))


@triton.jit
def _ramp_inverse(g, f, w):
    """The v in [0, w] with _ramp(g, v) = f * _ramp(g, w), for f in [0, 1]."""
    small = tl.abs(g * w) < 1e-3
    g_safe = tl.where(small, 1.0, g)
    # (1 - f) + f * 2^(g w), not 1 + f * (2^(g w) - 1): no cancellation to 0 when g w << 0
    v = tl.log2((1.0 - f) + f * tl.exp2(g * w)) / g_safe
    return tl.where(small, f * w, tl.minimum(tl.maximum(v, 0.0), w))


@triton.jit
def _add2(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _min2(a0, b0, a1, b1):
    return tl.minimum(a0, a1), tl.minimum(b0, b1)


@triton.jit
def _add6(a0, b0, c0, d0, e0, f0, a1, b1, c1, d1, e1, f1):
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1, e0 + e1, f0 + f1


@triton.jit
def _pick6(at_a, at_b, u, v, w, x, y, z):
    """u, v, w at the one position where at_a holds and x, y, z where at_b holds, in one
    reduction (each a sum of one entry and zeros: exact)."""
    return tl.reduce((tl.where(at_a, u, 0.0), tl.where(at_a, v, 0.0), tl.where(at_a, w, 0.0),
                      tl.where(at_b, x, 0.0), tl.where(at_b, y, 0.0), tl.where(at_b, z, 0.0)), 0, _add6)


@triton.jit
def _depth_at(p, j, n_j, G_j, g_j, units, LP: tl.constexpr):
    """Depth (log2 units) where the estimated count above reaches p inside bin j, which has
    n_j tokens above it, G_j in it and density slope g_j."""
    f = (p - n_j) / tl.maximum(G_j, 1e-30)
    a_j = _edge(j, LP) / units
    w_j = (_edge(j + 1, LP) - _edge(j, LP)) / units
    return a_j + _ramp_inverse(g_j, tl.minimum(tl.maximum(f, 0.0), 1.0), w_j)


@triton.jit
def _plan_kernel(
    Mc_ptr, Sc_ptr, Cum_ptr, Plan_ptr, num_chunks, c2, c2r, units, top_k, top_p, budget,
    TOP_K: tl.constexpr, NB: tl.constexpr, LP: tl.constexpr, C_PAD: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, C_PAD)
    c_ok = c < num_chunks
    m_c = tl.load(Mc_ptr + row * num_chunks + c, mask=c_ok, other=-float("inf"))
    s_c = tl.load(Sc_ptr + row * num_chunks + c, mask=c_ok, other=0.0)
    m = tl.max(m_c, 0)
    ref = tl.where(m > -float("inf"), m, 0.0)
    ref_c = tl.where(m_c > -float("inf"), m_c, ref)  # all -inf chunks hold no mass and no counts
    S = tl.sum(s_c * tl.exp2((ref_c - ref) * c2), 0)
    shift = (ref - ref_c) * c2r  # each chunk's max lies this deep below the row max
    cum_row = Cum_ptr + row.to(tl.int64) * num_chunks * NB

    # Estimated count above each bin's top edge; the bins' counts and their neighbours' (for the
    # slope of the log-linear density) are differences of neighbouring entries of this one vector.
    # Entries past NB - 1 are clamped: they only feed bin NB - 1 (not live) and the lower
    # neighbour of bin NB - 2 (which has none: dens_down = dens there).
    J = tl.arange(0, NB)
    live = J < NB - 1
    n_top = _count_above(cum_row, c, c_ok, shift, _edge(J, LP), NB, LP)
    n_bot = tl.gather(n_top, tl.minimum(J + 1, NB - 1), 0)
    n_up = tl.gather(n_top, tl.maximum(J - 1, 0), 0)
    n_down = tl.gather(n_top, tl.minimum(J + 2, NB - 1), 0)
    G = tl.where(live, n_bot - n_top, 0.0)
    a = _edge(J, LP) / units  # bin J spans depths [a, a + w] in log2 units of weight
    w = (_edge(J + 1, LP) - _edge(J, LP)) / units
    w_up = tl.where(J > 0, _edge(J, LP) - _edge(tl.maximum(J - 1, 0), LP), 1.0) / units
    w_down = (_edge(J + 2, LP) - _edge(J + 1, LP)) / units
    dens = tl.log2(tl.maximum(G / w, 1e-6))
    dens_up = tl.where(J > 0, tl.log2(tl.maximum((n_top - n_up) / w_up, 1e-6)), dens)
    dens_down = tl.where(J < NB - 2, tl.log2(tl.maximum((n_down - n_bot) / w_down, 1e-6)), dens)
    # log2 density slope per log2 unit of depth, between the centres of the neighbours used
    span = tl.where(J > 0, 0.5 * (w_up + w), 0.0) + tl.where(J < NB - 2, 0.5 * (w + w_down), 0.0)
    g = tl.minimum(tl.maximum((dens_down - dens_up) / span, -_MAX_SLOPE), _MAX_SLOPE)
    # A bin's tokens have density ~ 2^(g v), v = depth - a, and weight 2^-(a + v).
    mass = G * tl.exp2(-a) * _ramp(g - 1.0, w) / _ramp(g, w)
    est, n_all = tl.reduce((mass, G), 0, _add2)
    mass = mass * tl.where(est > 0.0, S / est, 1.0)

    if TOP_K:
        p_lo = top_k + budget
        p_hi = p_lo * 0.0 - 1.0  # no upper end: U = inf
    else:
        target = top_p * S
        above = tl.cumsum(mass, 0) - mass
        js = tl.min(tl.where(live & (above + mass >= target), J, NB - 1), 0)
        # every value at bin js in one reduction (the bin's width is a function of js)
        above_s, m_s, gs, n_s, G_s, _ = _pick6(J == js, J == js, above, mass, g, n_top, G, G)
        ws = (_edge(js + 1, LP) - _edge(js, LP)) / units
        f = (target - above_s) / tl.maximum(m_s, 1e-30)
        v = _ramp_inverse(gs - 1.0, tl.minimum(tl.maximum(f, 0.0), 1.0), ws)
        p0 = n_s + G_s * _ramp(gs, v) / _ramp(gs, ws)
        p0 = tl.where(js < NB - 1, p0, n_all)
        p_lo = p0 + budget
        p_hi = p0 - budget

    # Depths where the estimated count above reaches p_lo and p_hi (the histogram's bottom if never).
    jl, jh = tl.reduce((tl.where(live & (n_bot > p_lo), J, NB - 1),
                        tl.where(live & (n_bot > p_hi), J, NB - 1)), 0, _min2)
    nl, Gl, gl, nh, Gh, gh = _pick6(J == jl, J == jh, n_top, G, g, n_top, G, g)
    d_lo = _depth_at(p_lo, jl, nl, Gl, gl, units, LP)
    d_hi = _depth_at(p_hi, jh, nh, Gh, gh, units, LP)
    lo = ref - d_lo * units / c2r
    hi = tl.where(p_hi > 0.0, ref - d_hi * units / c2r, _INF)
    tl.store(Plan_ptr + row * 4, ref)
    tl.store(Plan_ptr + row * 4 + 1, S)
    tl.store(Plan_ptr + row * 4 + 2, lo)
    tl.store(Plan_ptr + row * 4 + 3, hi)


# ----------------------------------------------------------------------------- sweep 2: compact


@triton.jit
def _compact_kernel(
    X_ptr, Plan_ptr, Above_ptr, Cnt_ptr, Xs_ptr, Ids_ptr, V, stride_xb, num_chunks, c2,
    CHUNK: tl.constexpr, CAP: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    x = tl.load(X_ptr + row.to(tl.int64) * stride_xb + offs, mask=ok,
                other=-float("inf")).to(tl.float32)
    m = tl.load(Plan_ptr + row * 4)
    lo = tl.load(Plan_ptr + row * 4 + 2)
    hi = tl.load(Plan_ptr + row * 4 + 3)
    # The same weight expression as the draw kernel, so the masses agree to the bit.
    w = tl.exp2((x - m) * c2)
    tl.store(Above_ptr + row * num_chunks + c, tl.sum(tl.where(ok & (x >= hi), w, 0.0), 0))
    inb = ok & (x >= lo) & (x < hi)
    num = tl.sum(inb.to(tl.int32), 0)
    if num > 0:
        # One atomic per chunk reserves its slots; the order within the buffer does not matter.
        first = tl.atomic_add(Cnt_ptr + row, num)
        pos = first + tl.cumsum(inb.to(tl.int32), 0) - 1
        keep = inb & (pos < CAP)  # past CAP only the count grows: the draw kernel falls back
        dst = row.to(tl.int64) * CAP + pos
        tl.store(Xs_ptr + dst, x, mask=keep)
        tl.store(Ids_ptr + dst, offs, mask=keep)


# ----------------------------------------------------------------------------- draw


@triton.jit
def _token_logprob(row_ptr, token, m, Mc_ptr, S1_ptr, row, num_chunks, C_PAD: tl.constexpr):
    """log_softmax(x)[token] at temperature 1, from the row max m, sweep 1's chunk maxima m_c and
    chunk masses s1_c = sum exp(x - m_c): logsumexp = m + log(sum_c s1_c exp(m_c - m))."""
    c = tl.arange(0, C_PAD)
    c_ok = c < num_chunks
    m_c = tl.load(Mc_ptr + row * num_chunks + c, mask=c_ok, other=-float("inf"))
    s_c = tl.load(S1_ptr + row * num_chunks + c, mask=c_ok, other=0.0)
    # an all -inf chunk holds no mass (s1_c = 0); any finite shift keeps its term 0
    ref_c = tl.where(m_c > -float("inf"), m_c, m)
    mass = tl.sum(s_c * tl.exp2((ref_c - m) * _LOG2E_TL), 0)
    x = tl.load(row_ptr + token).to(tl.float32)
    return (x - m) - tl.log2(mass) * _LN2_TL


@triton.jit
def _min_max(a0, b0, a1, b1):
    return tl.minimum(a0, a1), tl.maximum(b0, b1)


@triton.jit
def _add_min_max(s0, a0, b0, s1, a1, b1):
    return s0 + s1, tl.minimum(a0, a1), tl.maximum(b0, b1)


@triton.jit
def _add_add_min_max(s0, t0, a0, b0, s1, t1, a1, b1):
    return s0 + s1, t0 + t1, tl.minimum(a0, a1), tl.maximum(b0, b1)


@triton.jit
def _key_range(key, live):
    """(smallest, largest) int32 key where live, in one reduction; (2^31 - 1, -2^31) if none."""
    return tl.reduce((tl.where(live, key, 2**31 - 1), tl.where(live, key, -(2**31))), 0, _min_max)


@triton.jit
def _sum_key_range(wts, key):
    """sum(wts) and the smallest and largest key of positive weight, in one reduction."""
    live = wts > 0.0
    return tl.reduce((wts, tl.where(live, key, 2**31 - 1), tl.where(live, key, -(2**31))), 0,
                     _add_min_max)


@triton.jit
def _select_key(key, wts, target, lo, hi, P: tl.constexpr):
    """The largest int32 k with W(k) = sum(wts where key >= k) >= target, given lo <= k <= hi
    with lo and hi keys of positive weight (W(lo) >= target > W(hi + 1)).

    Each pass evaluates W at P pivots spread over [lo, hi] in one [P, n] reduction, keeps the
    keys from the last pivot that reaches target to the one before the first that does not, and
    snaps both ends to keys of positive weight (one more reduction). It ends when one key is
    left: after at most log_(P+1) of the key range passes, and fewer when the keys are sparse
    (bf16 logits: their keys are multiples of 2^16, so a few dozen values take two passes).
    W is a masked sum of the same tree for every pivot, so it never increases with the pivot
    (fp32 addition of non-negative terms is monotone) and the kept pivots are a prefix.
    """
    j = tl.arange(0, P)
    live = wts > 0.0
    while lo < hi:
        lo64 = lo.to(tl.int64)
        q = (lo64 + ((hi.to(tl.int64) - lo64 + 1) * (j + 1)) // (P + 1)).to(tl.int32)  # [P] in [lo, hi]
        reach = tl.sum(tl.where(key[None, :] >= q[:, None], wts[None, :], 0.0), 1) >= target
        new_lo = tl.max(tl.where(reach, q, lo), 0)
        # >= new_lo: fp32 round-off between W(lo) here and the caller's check must not empty it
        new_hi = tl.maximum(tl.min(tl.where(reach, hi, q - 1), 0), new_lo)
        a, b = _key_range(key, live & (key >= new_lo) & (key <= new_hi))
        lo = tl.where(a <= b, a, new_lo)
        hi = tl.where(a <= b, b, new_lo)
    return lo


@triton.jit
def _tie_stats(key, w, ids, live, t_key):
    """The buffer's mass above the key t_key, its count of tokens at t_key, and the smallest and
    largest index among them, in one reduction."""
    tied = live & (key == t_key)
    return tl.reduce((tl.where(key > t_key, w, 0.0), tied.to(tl.float32), tl.where(tied, ids, 2**31 - 1),
                      tl.where(tied, ids, -1)), 0, _add_add_min_max)


@triton.jit
def _draw_kernel(
    X_ptr, U_ptr, Out_ptr, Ok_ptr, Lp_ptr, Mc_ptr, Sc_ptr, S1_ptr, Plan_ptr, Above_ptr, Cnt_ptr,
    Xs_ptr, Ids_ptr, V, stride_xb, num_chunks, c2, top_k, top_p,
    TOP_K: tl.constexpr, TOP_P: tl.constexpr, LOGPROBS: tl.constexpr, CHUNK: tl.constexpr,
    C_PAD: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr, NV: tl.constexpr, NK: tl.constexpr,
    BLOCK: tl.constexpr, DRAW_BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = X_ptr + row.to(tl.int64) * stride_xb  # int64: B * stride overflows int32
    u = tl.load(U_ptr + row)
    c = tl.arange(0, C_PAD)
    c_ok = c < num_chunks
    i = tl.arange(0, CAP)
    t_key = tl.full([], -(2**31), tl.int32)  # kept: key > t_key, or key == t_key and index <= tie_idx
    tie_idx = tl.full([], 0, tl.int32) + V
    if TOP_K or TOP_P:
        m = tl.load(Plan_ptr + row * 4)
        above_c = tl.load(Above_ptr + row * num_chunks + c, mask=c_ok, other=0.0)
        n = tl.load(Cnt_ptr + row)
        src = row.to(tl.int64) * CAP + i
        live = i < n
        xs = tl.load(Xs_ptr + src, mask=live, other=-float("inf"))
        # Only keys and weights stay live through the key search (CAP values each: registers are
        # the limit here); the indices are loaded once the threshold is known.
        key = _key(xs)
        w = tl.exp2((xs - m) * c2)  # 0 on the -inf padding
        ok = n <= CAP
        base = 0.0  # mass of x >= U, all kept when the bracket holds t (top-p alone; else U = inf)
        if TOP_K:
            # The buffer holds every token >= L; with at least k of them it holds the k-th.
            ok = ok & (n >= top_k)
            _, lo, hi = _sum_key_range(live.to(tl.float32), key)
            t_key = _select_key(key, live.to(tl.float32), top_k * 1.0, lo, hi, P)
            w = tl.where(key >= t_key, w, 0.0)
        total, lo, hi = _sum_key_range(w, key)  # the kept buffer mass so far, its keys' range
        if TOP_P:
            if TOP_K:
                target = top_p * total
            else:
                base = tl.sum(above_c, 0)
                target = top_p * tl.load(Plan_ptr + row * 4 + 1)
                ok = ok & (base < target) & (base + total >= target)
            t_key = _select_key(key, w, target - base, lo, hi, P)
            ids = tl.load(Ids_ptr + src, mask=live, other=V)
            above, count, id_lo, id_hi = _tie_stats(key, w, ids, live, t_key)
            above += base
            e_t = tl.exp2((_value(t_key) - m) * c2)
            # The official rule keeps a tied token while the mass sorted above it is < target.
            num_ties = tl.minimum(tl.maximum(tl.ceil((target - above) / e_t), 1.0), count)
            # Summed otherwise than the chunk masses below: the two agree to fp32 round-off, and
            # where they do not, the draw is the row's last kept token (the eager twin's rule).
            kept_mass = above + num_ties * e_t
            if ok & (num_ties < count):
                # The num_ties-th smallest index among the tied tokens: the largest -index with
                # at least num_ties tied tokens at or above it.
                tie_idx = -_select_key(-ids, (live & (key == t_key)).to(tl.float32), num_ties,
                                       -id_hi, -id_lo, P)
        else:
            ids = tl.load(Ids_ptr + src, mask=live, other=V)
            kept_mass = total  # no top-p: every token >= the k-th (U = inf, so base = 0)
        wk = tl.where((key > t_key) | ((key == t_key) & (ids <= tie_idx)), w, 0.0)
    else:
        m_c = tl.load(Mc_ptr + row * num_chunks + c, mask=c_ok, other=-float("inf"))
        m = tl.max(m_c, 0)
        ref_c = tl.where(m_c > -float("inf"), m_c, m)
        above_c = tl.load(Sc_ptr + row * num_chunks + c, mask=c_ok, other=0.0) * tl.exp2((ref_c - m) * c2)
        kept_mass = tl.sum(above_c, 0)
        ok = m > -float("inf")

    if ok:
        target_u = u * kept_mass
        # The first chunk whose cumulative kept mass exceeds target_u, P chunk ends a pass (one
        # reduction over the chunks' masses above the bracket, one over the buffer). before: the
        # mass of the chunks before lo, from the pass that moved lo (the same sum the choice read).
        j = tl.arange(0, P)
        lo = tl.full([], 0, tl.int32)
        hi = tl.full([], 0, tl.int32) + num_chunks
        before = 0.0
        while lo < hi:
            q = lo + ((hi - lo) * (j + 1)) // (P + 1)  # [P] in [lo, hi)
            mass = tl.sum(tl.where(c[None, :] <= q[:, None], above_c[None, :], 0.0), 1)
            if TOP_K or TOP_P:
                mass += tl.sum(tl.where(ids[None, :] < (q[:, None] + 1) * CHUNK, wk[None, :], 0.0), 1)
            past = mass > target_u  # never decreases with q: kept masses are non-negative
            hi = tl.min(tl.where(past, q, hi), 0)
            lo = tl.max(tl.where(past, lo, q + 1), 0)
            before = tl.max(tl.where(past, before, mass), 0)
        cc = lo
        if lo >= num_chunks:
            # fp32 round-off left every cumulative mass <= target_u: the row's last kept token
            last = tl.max(tl.where(c_ok & (above_c > 0.0), c, -1), 0)
            if TOP_K or TOP_P:
                last = tl.maximum(last, tl.max(tl.where(wk > 0.0, ids // CHUNK, -1), 0))
            cc = tl.maximum(last, 0)
            before = tl.full([], -float("inf"), tl.float32)  # no prefix exceeds target_u
        offs = cc * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        xk = _key(x)
        kept = (xk > t_key) | ((xk == t_key) & (offs <= tie_idx))
        wx = tl.where(kept & (offs < V), tl.exp2((x - m) * c2), 0.0)
        # Parallel prefix sums round each prefix on its own: only kept tokens may be drawn, and
        # if round-off leaves every prefix <= target_u, the chunk's last kept token.
        first, last_kept = tl.reduce(
            (tl.where((before + tl.cumsum(wx, 0) > target_u) & (wx > 0.0), offs, V),
             tl.where(wx > 0.0, offs, -1)), 0, _min_max)
        token = tl.where(first < V, first, tl.maximum(last_kept, 0))
    else:
        token = _search_token(row_ptr, V, u, c2, top_k, top_p, TOP_K, TOP_P, NV, NK, BLOCK,
                              DRAW_BLOCK, MAX_PASSES)
    token = tl.minimum(token, V - 1)
    tl.store(Out_ptr + row, token.to(tl.int64))
    tl.store(Ok_ptr + row, ok.to(tl.int32))
    if LOGPROBS:
        tl.store(Lp_ptr + row, _token_logprob(row_ptr, token, m, Mc_ptr, S1_ptr, row, num_chunks, C_PAD))


# ----------------------------------------------------------------------------- log-probs of given tokens


@triton.jit
def _token_logprob_kernel(X_ptr, Tok_ptr, Out_ptr, V, stride_xb, BLOCK: tl.constexpr):
    """One row per program: log_softmax(x)[token] by an online log-sum-exp over the row."""
    row = tl.program_id(0)
    row_ptr = X_ptr + row.to(tl.int64) * stride_xb  # int64: B * stride overflows int32
    # a finite start, so that lane_m - new_m is never inf - inf on an all -inf prefix
    lane_m = tl.full([BLOCK], _NEG_BIG, tl.float32)
    lane_s = tl.zeros([BLOCK], tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        new_m = tl.maximum(lane_m, x)
        lane_s = lane_s * tl.exp2((lane_m - new_m) * _LOG2E_TL) + tl.exp2((x - new_m) * _LOG2E_TL)
        lane_m = new_m
    m = tl.max(lane_m, 0)
    mass = tl.sum(lane_s * tl.exp2((lane_m - m) * _LOG2E_TL), 0)
    token = tl.load(Tok_ptr + row)
    # an id outside [0, V) reads nothing and gives NaN (the launcher cannot check ids without a sync)
    inside = (token >= 0) & (token < V)
    x_t = tl.load(row_ptr + tl.where(inside, token, 0), mask=inside, other=float("nan")).to(tl.float32)
    tl.store(Out_ptr + row, (x_t - m) - tl.log2(mass) * _LN2_TL)


# ----------------------------------------------------------------------------- launcher


def _config(device: torch.device, V: int) -> _Config:
    if device.type == "cuda":
        return _CUDA
    chunk = max(16, triton.next_power_of_2(-(-V // _INTERPRET_CHUNKS)))
    return _Config(**{**_INTERPRET.__dict__, "chunk": chunk})


def _sample(logits: torch.Tensor, uniform: torch.Tensor, temperature: float, top_k: int,
            top_p: float, cfg: _Config, logprobs: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """tokens [B] int64, resolved [B] int32 (1 where the two sweeps sufficed, 0 where the row
    took the search fallback) and, if `logprobs`, the tokens' log-probs [B] fp32 at temperature 1
    before filtering (else None)."""
    B, V = logits.shape
    dev = logits.device
    tokens = torch.empty(B, dtype=torch.int64, device=dev)
    resolved = torch.empty(B, dtype=torch.int32, device=dev)
    token_lp = torch.empty(B, dtype=torch.float32, device=dev) if logprobs else None
    if B == 0:
        return tokens, resolved, token_lp
    num_chunks = -(-V // cfg.chunk)
    c_pad = _chunks_pad(num_chunks)
    nb, lp = cfg.num_bins, cfg.log2_bins_per_doubling
    use_k, use_p = 0 < top_k < V, top_p < 1.0
    c2 = _LOG2E / temperature
    c2r = c2 * cfg.units_per_log2
    f32 = dict(dtype=torch.float32, device=dev)
    m_c, s_c = torch.empty((B, num_chunks), **f32), torch.empty((B, num_chunks), **f32)
    cum = torch.empty((B, num_chunks, nb), dtype=torch.int32, device=dev)
    count = torch.empty(B, dtype=torch.int32, device=dev)
    unit_mass = logprobs and temperature != 1.0
    s1_c = torch.empty((B, num_chunks), **f32) if unit_mass else s_c  # temperature 1: s_c is it
    warps = cfg.sweep_warps
    _stats_kernel[(B, num_chunks)](logits, m_c, s_c, s1_c, cum, count, V, logits.stride(0), num_chunks,
                                   c2, c2r, NB=nb, LP=lp, CHUNK=cfg.chunk, UNIT_MASS=unit_mass,
                                   num_warps=warps)
    if use_k or use_p:
        plan, above, xs, ids = _bracket(logits, m_c, s_c, cum, count, top_k, top_p, use_k, c2, c2r, cfg)
    else:
        plan = above = xs = ids = m_c  # not read without a filter
    on_cuda = dev.type == "cuda"
    _draw_kernel[(B,)](
        logits, uniform, tokens, resolved, tokens if token_lp is None else token_lp, m_c, s_c, s1_c,
        plan, above, count, xs, ids, V, logits.stride(0), num_chunks, c2, top_k, top_p,
        TOP_K=use_k, TOP_P=use_p, LOGPROBS=logprobs, CHUNK=cfg.chunk, C_PAD=c_pad, CAP=cfg.cap,
        P=cfg.draw_pivots, NV=_NUM_VALUE_PIVOTS, NK=_NUM_KEY_PIVOTS,
        BLOCK=_SEARCH_BLOCK_CUDA if on_cuda else cfg.chunk,
        DRAW_BLOCK=_SEARCH_DRAW_BLOCK_CUDA if on_cuda else cfg.chunk, MAX_PASSES=_MAX_PASSES,
        num_warps=cfg.draw_warps,
    )
    return tokens, resolved, token_lp


def _bracket(logits: torch.Tensor, m_c: torch.Tensor, s_c: torch.Tensor, cum: torch.Tensor, count: torch.Tensor,
             top_k: int, top_p: float, use_k: bool, c2: float, c2r: float, cfg: _Config
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sweep 2 of a filtered draw: each row's plan (the bracket from the histogram), then the mass above
    it per chunk and the bracket's tokens compacted (module docstring). Returns plan [B, 4], above
    [B, chunks], xs [B, cap] fp32 and ids [B, cap] int32."""
    (B, V), dev = logits.shape, logits.device
    num_chunks = m_c.shape[1]
    f32 = dict(dtype=torch.float32, device=dev)
    plan, above = torch.empty((B, 4), **f32), torch.empty((B, num_chunks), **f32)
    xs = torch.empty((B, cfg.cap), **f32)
    ids = torch.empty((B, cfg.cap), dtype=torch.int32, device=dev)
    _plan_kernel[(B,)](m_c, s_c, cum, plan, num_chunks, c2, c2r, cfg.units_per_log2, top_k,
                       top_p, float(cfg.budget), TOP_K=use_k, NB=cfg.num_bins, LP=cfg.log2_bins_per_doubling,
                       C_PAD=_chunks_pad(num_chunks), num_warps=cfg.plan_warps)
    _compact_kernel[(B, num_chunks)](logits, plan, above, count, xs, ids, V, logits.stride(0),
                                     num_chunks, c2, CHUNK=cfg.chunk, CAP=cfg.cap,
                                     num_warps=cfg.sweep_warps)
    return plan, above, xs, ids


def _check_args(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                name: str) -> None:
    if logits.dim() != 2:
        raise ValueError(f"{name}: logits must be [B, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{name}: logits must be bf16, fp16 or fp32, got {logits.dtype}")
    if not temperature > 0:
        raise ValueError(f"{name}: temperature must be > 0, got {temperature}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"{name}: top_k must be an int >= 0 (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{name}: top_p must be in (0, 1] (1 = off), got {top_p}")


def _check_uniform(logits: torch.Tensor, uniform: torch.Tensor, name: str) -> None:
    if uniform.shape != (logits.shape[0],) or uniform.dtype != torch.float32:
        raise ValueError(f"{name}: uniform must be [B] fp32 with B = {logits.shape[0]}; got "
                         f"{tuple(uniform.shape)} {uniform.dtype}")
    if uniform.device != logits.device:
        raise ValueError(f"{name}: logits ({logits.device}) and uniform ({uniform.device}) must be "
                         "on one device")


def _check_inputs(logits: torch.Tensor, uniform: torch.Tensor, temperature: float, top_k: int,
                  top_p: float, name: str) -> None:
    _check_args(logits, temperature, top_k, top_p, name)
    _check_uniform(logits, uniform, name)
    if logits.stride(1) != 1:
        raise ValueError(f"{name}: the last dimension of logits must be contiguous")


def _check_impl(impl: str, name: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"{name}: impl must be one of {IMPLS}, got {impl!r}")


def sample_from_logits(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    impl: str = "triton",
) -> torch.Tensor:
    """One token per row by temperature, top-k, top-p and inverse CDF, without sorting V.

    Args:
        logits: [B, V] bf16/fp16/fp32 next-token logits, last dim contiguous.
        uniform: [B] fp32 in [0, 1), one draw per row from the caller's seeded generator.
        temperature: logits are divided by it (> 0).
        top_k: keep the k largest logits, ties with the k-th included (0 = off).
        top_p: then keep the smallest most-likely set whose renormalised mass reaches top_p
            (1 = off); ties at its threshold are taken in vocabulary order.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        tokens: [B] int64, the first index (vocabulary order) whose running kept probability
        exceeds uniform.
    """
    _check_impl(impl, "sample_from_logits")
    if impl == "eager":
        return sample_from_logits_eager(logits, uniform, temperature=temperature, top_k=top_k,
                                        top_p=top_p)
    _check_inputs(logits, uniform, temperature, top_k, top_p, "sample_from_logits")
    tokens, _, _ = _sample(logits, uniform, temperature, top_k, top_p, _config(logits.device, logits.shape[1]))
    return tokens


def sample_with_logprobs(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    impl: str = "triton",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_from_logits`, and each token's log-prob under the unfiltered distribution.

    Same arguments as `sample_from_logits`.

    Returns:
        tokens: [B] int64, `sample_from_logits`'s.
        logprobs: [B] fp32, log_softmax(logits.float())[token]: temperature 1, no top-k or top-p,
            whatever the sampling settings (the distribution the trainer's log-probs are taken
            under, reference 4.9). Computed from sweep 1's sums: no extra pass over the logits.
    """
    _check_impl(impl, "sample_with_logprobs")
    if impl == "eager":
        return sample_with_logprobs_eager(logits, uniform, temperature=temperature, top_k=top_k,
                                          top_p=top_p)
    _check_inputs(logits, uniform, temperature, top_k, top_p, "sample_with_logprobs")
    tokens, _, logprobs = _sample(logits, uniform, temperature, top_k, top_p,
                                  _config(logits.device, logits.shape[1]), logprobs=True)
    return tokens, logprobs


def _kept_weights(x: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """fp64 weights exp((x - max) / temperature) of the kept tokens of fp32 rows x, 0 elsewhere."""
    w = ((x - x.amax(-1, keepdim=True)).double() / temperature).exp()  # (rows, V)
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        w = w.masked_fill(x < kth, 0.0)
    if top_p < 1.0:
        # Most likely first; stable, so tied tokens rank in vocabulary order.
        ws, order = w.sort(dim=-1, descending=True, stable=True)
        above = ws.cumsum(-1) - ws  # mass of the tokens ranked above each
        keep_sorted = above < top_p * ws.sum(-1, keepdim=True)
        w = w * torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return w


def kept_mask_eager(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """[B, V] bool: the tokens `sample_from_logits` may return (kept, positive probability)."""
    _check_args(logits, temperature, top_k, top_p, "kept_mask_eager")
    return _kept_weights(logits.float(), temperature, top_k, top_p) > 0


def sample_from_logits_eager(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    impl: str = "eager",
) -> torch.Tensor:
    """The plain-PyTorch twin of `sample_from_logits` (the CPU path and the test oracle).

    Filters as the official rule does (stable sort, so ties at the top-p threshold are taken in
    vocabulary order), in fp64 from the fp32 logits, over chunks of rows; then searchsorted of
    uniform * kept mass in the kept cumulative sum in vocabulary order. Same arguments and return.
    """
    if impl != "eager":
        raise ValueError(f"sample_from_logits_eager: impl must be 'eager', got {impl!r}")
    _check_args(logits, temperature, top_k, top_p, "sample_from_logits_eager")
    _check_uniform(logits, uniform, "sample_from_logits_eager")
    B, V = logits.shape
    rows = max(1, _EAGER_CHUNK_ELEMS // max(V, 1))
    parts = [torch.empty(0, dtype=torch.int64, device=logits.device)]
    for b0 in range(0, B, rows):
        w = _kept_weights(logits[b0:b0 + rows].float(), temperature, top_k, top_p)
        cdf = w.cumsum(-1)  # (rows, V) fp64
        target = uniform[b0:b0 + rows].double() * cdf[:, -1]
        token = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
        last = torch.where(w > 0, torch.arange(V, device=w.device), -1).amax(-1)
        parts.append(torch.where(token < V, token, last).clamp(min=0))
    return torch.cat(parts)


def sample_with_logprobs_eager(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    impl: str = "eager",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain-PyTorch twin of `sample_with_logprobs`: `sample_from_logits_eager`'s tokens and
    `token_logprobs_eager` at them. Same arguments and return."""
    if impl != "eager":
        raise ValueError(f"sample_with_logprobs_eager: impl must be 'eager', got {impl!r}")
    tokens = sample_from_logits_eager(logits, uniform, temperature=temperature, top_k=top_k, top_p=top_p)
    return tokens, token_logprobs_eager(logits, tokens)


def _check_tokens(logits: torch.Tensor, tokens: torch.Tensor, name: str) -> None:
    if logits.dim() != 2:
        raise ValueError(f"{name}: logits must be [B, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{name}: logits must be bf16, fp16 or fp32, got {logits.dtype}")
    if tokens.shape != (logits.shape[0],) or tokens.dtype != torch.int64:
        raise ValueError(f"{name}: tokens must be [B] int64 with B = {logits.shape[0]}; got "
                         f"{tuple(tokens.shape)} {tokens.dtype}")
    if tokens.device != logits.device:
        raise ValueError(f"{name}: logits ({logits.device}) and tokens ({tokens.device}) must be on one device")


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """log_softmax(logits.float())[token] per row, without a [B, V] intermediate.

    The greedy path's log-probs (sampling gets them from `sample_with_logprobs` at no extra pass).

    Args:
        logits: [B, V] bf16/fp16/fp32, last dim contiguous.
        tokens: [B] int64 ids in [0, V) (an id outside gives NaN; the eager twin raises).
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        [B] fp32 log-probs.
    """
    _check_impl(impl, "token_logprobs")
    if impl == "eager":
        return token_logprobs_eager(logits, tokens)
    _check_tokens(logits, tokens, "token_logprobs")
    if logits.stride(1) != 1:
        raise ValueError("token_logprobs: the last dimension of logits must be contiguous")
    B, V = logits.shape
    out = torch.empty(B, dtype=torch.float32, device=logits.device)
    if B == 0:
        return out
    block = _SEARCH_BLOCK_CUDA if logits.device.type == "cuda" else _config(logits.device, V).chunk
    _token_logprob_kernel[(B,)](logits, tokens, out, V, logits.stride(0), BLOCK=block,
                                num_warps=8 if logits.device.type == "cuda" else 1)
    return out


def token_logprobs_eager(logits: torch.Tensor, tokens: torch.Tensor, *, impl: str = "eager") -> torch.Tensor:
    """The plain-PyTorch twin of `token_logprobs`: fp32 log_softmax over chunks of rows, then gather."""
    if impl != "eager":
        raise ValueError(f"token_logprobs_eager: impl must be 'eager', got {impl!r}")
    _check_tokens(logits, tokens, "token_logprobs_eager")
    B, V = logits.shape
    rows = max(1, _EAGER_CHUNK_ELEMS // max(V, 1))
    parts = [torch.empty(0, dtype=torch.float32, device=logits.device)]
    for b0 in range(0, B, rows):
        x = logits[b0:b0 + rows].float()  # (rows, V)
        parts.append(x.gather(1, tokens[b0:b0 + rows, None])[:, 0] - x.logsumexp(-1))
    return torch.cat(parts)
