"""Exact temperature / top-k / top-p sampling from [B, V] logits without sorting the vocabulary.

The math this file replaces, as eager code (the official rule, reference 4.2, and
`oreal_fast.rollout.sampling.sample_next_token`):

    z = logits.float() / temperature                                     # [B, V]
    z = z.masked_fill(z < z.topk(top_k).values[:, -1:], -inf)            # top-k, ties with the k-th kept
    s, order = z.sort(ascending)                                         # top-p: the sort this file removes
    drop = s.softmax(-1).cumsum(-1) <= 1 - top_p; drop[:, -1] = False    # the smallest top set reaching top_p
    token = multinomial(z.masked_fill(drop scattered back, -inf).softmax(-1))

Here the kept set is found by searching in value space, and the token is drawn by inverse CDF
from one caller-made uniform u per row: the first index i, in vocabulary order, whose running
kept mass exceeds u * kept_mass. One Triton program owns one row and streams it several times:

1. statistics: row max m (and the smallest finite logit and the number of finite logits when
   top-k is on);
2. top-k: a selection of the k-th largest value (`_select` with unit weights);
3. the kept mass S_k = sum of exp((x - m) / temperature) over x >= k-th (all x without top-k);
4. top-p: a selection of the threshold t, the largest logit with mass(x >= t) >= top_p * S_k;
5. the inverse CDF, which stops at the chunk where the running mass crosses u * kept_mass.

`_select` finds the largest data value v with W(x >= v) >= target, where W is a count (top-k) or
the mass exp((x - m) / temperature) (top-p), keeping a bracket [lo, hi) with W(x >= lo) >= target
> W(x >= hi). Each pass over the row evaluates W at `_NUM_VALUE_PIVOTS` pivots spaced evenly in
value and `_NUM_KEY_PIVOTS` spaced evenly in the fp32 bit pattern (the value pivots converge fast
on ordinary rows; the bit-pattern ones bound the number of passes on any row, e.g. one holding
-1e30 masked logits), and also "peels" the largest value v1 below hi with its weight: if
W(x >= hi) + W(x == v1) >= target, v1 is the answer, exactly, and W(x > v1) = W(x >= hi). The
passes are elementwise per lane, with one reduction at their end. The official rule keeps a top-p
token iff the mass of the tokens sorted above it is < top_p: the tokens strictly above t, then
as many tokens tied at t as that takes, n = ceil((top_p * S_k - W(x > t)) / e(t)); which tied
tokens torch.sort puts first is unspecified, and here they are the n of lowest vocabulary index.

Invariant: for continuous logits the result is `sample_from_logits_eager`'s, token for token,
except where u * kept_mass or the top-p mass lies within fp32 round-off of a boundary; as a
distribution it is the official one.

Budget (one row of V logits; every pass reads the row from memory or L2): pass 1, for top-k
its search (usually 2-4 passes), one pass for the kept mass, for top-p usually 1-4 passes (one
when the most likely token alone reaches top_p; at most 22 on any row, see `_MAX_PASSES`), then
on average half a pass for the draw. Per element and search pass: one exp2 (mass searches only) and ~3 operations per pivot. All sums, the max, the masses
and the counts (exact below 2^24 > V) are fp32. Allocated: the [B] int64 output only; no [B, V]
tensor, no workspace, no host sync, no allocation that depends on data, so the call can be
captured in a CUDA graph.

Limits: one program per row, so a batch below the number of multiprocessors leaves some idle,
and above it the search passes are bound by arithmetic (~3 operations per pivot per element),
not by memory: the time grows with B times the number of passes.
Ties are decided on the logits as given, before the temperature (the official code divides first;
for bf16/fp16 logits the order is the same, for fp32 logits the division can merge neighbours
1 ulp apart). Logits must be finite or -inf (NaN or +inf rows give an unspecified token in
[0, V)). On CPU the Triton path runs only under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

IMPLS = ("triton", "eager")

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
# The interpreter cuts each row into about this many chunks, whatever V: the CPU tests cross
# chunk boundaries at every V and stay fast (its cost grows with the number of chunks).
_INTERPRET_CHUNKS = 4
# Eager twin: rows per chunk so that one fp64 [rows, V] tensor holds about this many elements.
_EAGER_CHUNK_ELEMS = 2**22

_LOG2E = 1.4426950408889634
_NEG_BIG = tl.constexpr(-1.0e30)  # finite stand-in for the max of an all -inf prefix
_INF = tl.constexpr(float("inf"))


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
    if impl not in IMPLS:
        raise ValueError(f"sample_from_logits: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "eager":
        return sample_from_logits_eager(logits, uniform, temperature=temperature, top_k=top_k,
                                        top_p=top_p)
    _check_args(logits, temperature, top_k, top_p, "sample_from_logits")
    _check_uniform(logits, uniform, "sample_from_logits")
    if logits.stride(1) != 1:
        raise ValueError("sample_from_logits: the last dimension of logits must be contiguous")
    B, V = logits.shape
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    if B == 0:
        return tokens
    on_cuda = logits.device.type == "cuda"
    block = _BLOCK_CUDA if on_cuda else max(16, triton.next_power_of_2(-(-V // _INTERPRET_CHUNKS)))
    draw_block = _DRAW_BLOCK_CUDA if on_cuda else block
    _sample_kernel[(B,)](
        logits, uniform, tokens, V, logits.stride(0), _LOG2E / temperature, top_k, top_p,
        TOP_K=0 < top_k < V, TOP_P=top_p < 1.0, NV=_NUM_VALUE_PIVOTS, NK=_NUM_KEY_PIVOTS,
        BLOCK=block, DRAW_BLOCK=draw_block, MAX_PASSES=_MAX_PASSES,
        num_warps=_NUM_WARPS_CUDA if on_cuda else 1,
    )
    return tokens


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
