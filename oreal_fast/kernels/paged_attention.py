"""Decode attention over a paged K/V pool: one query token per sequence, any context length.

The math this file replaces, as eager code (per sequence b, GQA group size G = Hq // Hkv):

    n = context_lens[b]
    slots = block_tables[b, :cdiv(n, bs)]                       # block ids, in order
    k = k_cache[slots].reshape(-1, Hkv, D)[:n]                  # [n, Hkv, D]
    v = v_cache[slots].reshape(-1, Hkv, D)[:n]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # [n, Hq, D]: q head i reads kv head i // G
    s = torch.einsum("hd,nhd->hn", q[b].float(), k.float()) * scale
    out[b] = torch.einsum("hn,nhd->hd", s.softmax(-1), v.float()).to(q.dtype)

Never allocated: the gathered [B, L, Hkv, D] keys/values, or any [B, Hq, L] scores.

Flash-decoding, in two stages. Stage 1 (`_paged_decode_split_kernel`), grid (B, Hkv, num_splits):
a program takes one KV head of one sequence and all G query heads that read it, as the rows of
one `tl.dot` (padded to 16 rows, the smallest dot tile; the padding is masked), and walks one
split of the sequence's tokens in tiles of BLOCK_N, each row gathered through the block table
(so any block size works and a tile may span blocks). Online softmax in base 2 (log2 e is folded
into the scale, so each exponential is one ex2). The split is the sequence's own length divided
by num_splits, so short sequences in a batch of long ones still spread over the splits; a
program whose split starts past the context writes a neutral partial (max -inf, sum 0). Stage 2
(`_paged_decode_combine_kernel`), grid (B, Hq), merges the splits by log-sum-exp weighting. With
one split, stage 1 writes the output itself and stage 2 does not run.

Shared prefixes (`shared`, a `SharedPrefix`): the 16 samples of a prompt begin with the same
prompt blocks (the prefix cache forks them), which the kernels above read once per row. With
`shared`, a third kernel (`_paged_decode_prefix_kernel`, grid (B, Hkv), run first) has the first row
of each group walk the group's prefix once for every row of the group: the G query heads of all
n rows are the n * G rows of one dot (112 of a 128-row tile for 16 rows of Qwen2.5-0.5B, against
7 of 16 per program above), and it writes each (row, head)'s unnormalised partial to [B, Hq]
fp32 max and sum and [B, Hq, D] fp32 output. Stage 1 then walks each row's own tokens only
(from prefix_lens[b]); with one split it merges the prefix's partial before it normalises, with
several stage 2 merges it beside the splits'. A group's prefix is read once instead of n times;
the extra traffic is the partials (B * Hq * (D + 2) * 4 bytes, written and read once: 3.8 MB
at B = 1024 with Qwen2.5-0.5B's heads, against 537 MB of K/V at 1024 tokens of context) and the
prefix kernel's launch.

num_splits comes from shapes only: B * Hkv * num_splits is the nearest to `programs_per_sm`
programs per multiprocessor (one full wave: every program starts at once and none waits for a
second wave), with at most one split per `min_split_tokens` of the block table's span
(max_blocks * block_size). Nothing reads context_lens on the host and the workspace size depends
on shapes only, so the call is CUDA-graph capturable.

Memory: reads each sequence's K and V once (2 * n * Hkv * D elements; a shared prefix once per
group), q once. Workspace with num_splits > 1: [B, Hq, num_splits, D] fp32 partial outputs and
[B, Hq, num_splits] fp32 max and sum, written and read once; with `shared`, the prefix's partials. FLOPs: 4 * n * Hq * D per sequence (the padded dot rows do
16 / G times that on the tensor cores; decode is memory-bound, so this costs no time).

Accumulators: scores, max, sum and the output accumulator are fp32; the probabilities are
rounded to the K/V dtype before the P @ V dot (as flash attention does), so bf16 outputs carry
about bf16 rounding error. All pool offsets are int64 (a 20 GiB pool overflows int32 element
offsets).

Limits: D a power of two in 16..256 (64 and 128 tested on GPU); G = Hq // Hkv at most 128;
context_lens must be in [1, max_blocks * block_size]: the Triton path does not check it (a check
is a device-side assert per call, i.e. extra kernels on the decode hot path), the eager twin does.
Block-table entries past a sequence's length are never read, nor are pool slots past its
context. The last dimension of q and of the pools must be contiguous, as must block_tables' rows.
With `shared`, fp32 inputs on a GPU give the prefix kernel a 128-row fp32 dot that spills registers
heavily on sm90 (correct, slow; the engine runs bf16, where it takes 112 registers and no spills).
On CPU the Triton path runs only under TRITON_INTERPRET=1 with fp32 inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from oreal_fast.kernels.common import check_pdl, gdc_launch_dependents, gdc_wait, pdl_launch

IMPLS = ("triton", "eager")
_LOG2E = 1.4426950408889634
# Stand-in for -inf inside the walk: exp2 of it minus a real max is 0, never NaN. Every tile the
# walk visits holds at least one real token, so the running max is real after the first tile.
_NEG_BIG = tl.constexpr(-1.0e30)
_MAX_SPLITS = 32
# the prefix kernel's dot tile: at most this many (row, query head) pairs of a group (a 16-sample group
# at G = 7 fills it; compiled for sm90 in bf16 at 8 warps: 112 registers a thread, and 199 at 256 rows,
# which leaves one program a multiprocessor)
_MAX_PREFIX_ROWS = 128
# Eager twin: sequences per chunk so that one gathered K (or V) chunk holds about this many elements.
_EAGER_CHUNK_ELEMS = 2**24


@dataclass(frozen=True)
class _Tiles:
    """Tile size of the key/value walk, the split target, the shortest split worth a program,
    launch shape."""

    block_n: int
    # stage 1 aims for this many programs per multiprocessor: decode is memory-bound, and several
    # resident programs per SM keep enough loads in flight
    programs_per_sm: int
    min_split_tokens: int
    num_warps: int
    num_stages: int
    # the prefix kernel's: its dot tile has up to max_group_rows * G rows (128 for 16 rows of G = 7)
    prefix_warps: int


_TILES_CUDA = _Tiles(block_n=64, programs_per_sm=4, min_split_tokens=512, num_warps=4, num_stages=2,
                     prefix_warps=8)
# The interpreter gets small tiles and short splits, so small test shapes cross tiles and splits;
# it has no SM count: one stands in (so its target is programs_per_sm programs).
_TILES_INTERPRET = _Tiles(block_n=16, programs_per_sm=8, min_split_tokens=32, num_warps=1, num_stages=1,
                          prefix_warps=1)


@dataclass(frozen=True)
class SharedPrefix:
    """Rows whose contexts begin with the same K/V blocks (the samples of one prompt, forked from
    its prefill), for the prefix kernel to read those blocks once per group.

    A group is a run of consecutive rows b..b+n-1 (1 <= n <= max_group_rows) whose block tables
    agree on their first prefix_lens[b] / block_size entries.

    Attributes:
        prefix_lens: [B] int32, the tokens of each row's context that its group shares: a multiple
            of the block size, below the row's context length or equal to it; 0 for a row in no group.
        group_rows: [B] int32, n at the first row of a group, 0 at every other row.
        max_group_rows: the largest n (a shape: the prefix kernel's dot tile has max_group_rows * G
            rows, G = Hq // Hkv; at most 128 of them: `max_group_rows`).
    """

    prefix_lens: torch.Tensor
    group_rows: torch.Tensor
    max_group_rows: int


def max_group_rows(num_heads: int, num_kv_heads: int) -> int:
    """The most rows a `SharedPrefix` group may have at these heads: as many as fill the prefix
    kernel's dot tile with their query heads (18 at Qwen2.5-0.5B's 14 / 2: 126 of 128 rows)."""
    return max(1, _MAX_PREFIX_ROWS // (num_heads // num_kv_heads))


@triton.jit
def _walk(q, bt_row, k_head, v_head, start, end, stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
          BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    """Online softmax of the query rows q [R, HEAD_DIM] over tokens [start, end) of one sequence's
    context, gathered through its block table (bt_row) from one KV head's pools, in tiles of
    BLOCK_N tokens: the unnormalised (max [R], sum [R], output [R, HEAD_DIM]) in fp32, in base 2."""
    R: tl.constexpr = q.shape[0]
    d = tl.arange(0, HEAD_DIM)
    m = tl.full((R,), _NEG_BIG, tl.float32)
    l = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, HEAD_DIM), tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        ok = tok < end
        # Masked: table entries and pool slots past the context are never read (they may hold
        # stale ids and NaN).
        blk = tl.load(bt_row + tok // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        slot = (tok % BLOCK_SIZE).to(tl.int64)
        k = tl.load(k_head + blk[:, None] * stride_kb + slot[:, None] * stride_kt + d[None, :],
                    mask=ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # (R, BLOCK_N)
        qk = tl.where(ok[None, :], qk, _NEG_BIG)
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_head + blk[:, None] * stride_vb + slot[:, None] * stride_vt + d[None, :],
                    mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m = m_new
    return m, l, acc


@triton.jit
def _paged_decode_split_kernel(
    Q_ptr, K_ptr, V_ptr, BT_ptr, CL_ptr, O_ptr, M_ptr, L_ptr, PL_ptr, PM_ptr, PS_ptr, PO_ptr,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_btb, stride_ob, stride_oh, stride_os,
    qk_scale, G, num_splits,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PREFIX: tl.constexpr, DOT_PREC: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # q and this step's K/V row are the previous kernel's: only the launch overlaps it
        gdc_launch_dependents()
        gdc_wait()
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.program_id(2)
    n_ctx = tl.load(CL_ptr + b)
    if PREFIX:  # the group's shared prefix is the prefix kernel's: walk the row's own tokens only
        n_first = tl.load(PL_ptr + b)
    else:
        n_first = 0
    # This split's share of the sequence, whole tiles: splits past the context stay empty.
    per_split = tl.cdiv(tl.cdiv(n_ctx - n_first, num_splits), BLOCK_N) * BLOCK_N
    start = n_first + s * per_split
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

    m, l, acc = _walk(q, bt_row, k_head, v_head, start, end, stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                      BLOCK_SIZE, HEAD_DIM, BLOCK_N, DOT_PREC)

    if SPLIT:
        # Unnormalised partials: an empty split (l = 0) stays 0 instead of 0 / 0.
        ms_off = (b * (G * tl.num_programs(1)) + heads) * num_splits + s
        tl.store(M_ptr + ms_off, tl.where(l > 0, m, float("-inf")), mask=g_ok)
        tl.store(L_ptr + ms_off, l, mask=g_ok)
        tl.store(O_ptr + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + d[None, :],
                 acc, mask=g_ok[:, None])
    else:
        if PREFIX:
            # One split: merge the prefix kernel's partial (run before this kernel) here. The
            # context holds at least one token, here or in the prefix, so l > 0 after the merge.
            if n_first > 0:
                p_off = b * (G * tl.num_programs(1)) + heads
                m_p = tl.load(PM_ptr + p_off, mask=g_ok, other=_NEG_BIG)
                m_all = tl.maximum(m, m_p)
                w_own, w_p = tl.exp2(m - m_all), tl.exp2(m_p - m_all)
                # (padding rows take a sum of 1: with no own tokens they would divide 0 by 0)
                l = l * w_own + tl.load(PS_ptr + p_off, mask=g_ok, other=1.0) * w_p
                acc = acc * w_own[:, None] + tl.load(PO_ptr + p_off[:, None] * HEAD_DIM + d[None, :],
                                                     mask=g_ok[:, None], other=0.0) * w_p[:, None]
        # One split covers the whole context (its own part), which holds at least one token: l > 0.
        out = acc / l[:, None]
        tl.store(O_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(O_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def _paged_decode_prefix_kernel(
    Q_ptr, K_ptr, V_ptr, BT_ptr, PL_ptr, GR_ptr, PM_ptr, PS_ptr, PO_ptr, B,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_btb,
    qk_scale, G,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, PDL: tl.constexpr,
):
    """Grid (B, Hkv): the program of a group's first row b and KV head h walks the group's shared
    prefix once, with every query head of h of every row of the group as the rows of one dot
    (row r of the group, head g of the GQA group at tile row r * G + g); unnormalised partials
    (max, sum, output) of each of those (row, head) pairs go to PM/PS/PO. Other rows' programs
    return at once."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    n_rows = tl.load(GR_ptr + b)
    n_prefix = tl.load(PL_ptr + b)
    if n_rows > 0 and n_prefix > 0:
        i = tl.arange(0, BLOCK_R)
        r = i // G
        i_ok = (r < n_rows) & (b + r < B)  # tile rows past the group (or the batch) are padding
        rows = b + r
        heads = h * G + i % G
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q_ptr + rows[:, None] * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=i_ok[:, None], other=0.0)
        bt_row = BT_ptr + b * stride_btb  # the group's rows share these table entries
        k_head = K_ptr + h * stride_kh
        v_head = V_ptr + h * stride_vh
        m, l, acc = _walk(q, bt_row, k_head, v_head, 0, n_prefix, stride_kb, stride_kt, stride_vb, stride_vt,
                          qk_scale, BLOCK_SIZE, HEAD_DIM, BLOCK_N, DOT_PREC)
        off = rows * (G * tl.num_programs(1)) + heads  # (row, query head) of [B, Hq]
        tl.store(PM_ptr + off, m, mask=i_ok)
        tl.store(PS_ptr + off, l, mask=i_ok)
        tl.store(PO_ptr + off[:, None] * HEAD_DIM + d[None, :], acc, mask=i_ok[:, None])


@triton.jit
def _paged_decode_combine_kernel(
    W_ptr, M_ptr, L_ptr, PL_ptr, PM_ptr, PS_ptr, PO_ptr, Out_ptr, stride_outb, stride_outh, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, PREFIX: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    b = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    row = b * tl.num_programs(1) + hq
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    m = tl.load(M_ptr + row * num_splits + s, mask=s_ok, other=float("-inf"))
    l = tl.load(L_ptr + row * num_splits + s, mask=s_ok, other=0.0)
    d = tl.arange(0, HEAD_DIM)
    o = tl.load(W_ptr + (row * num_splits + s)[:, None] * HEAD_DIM + d[None, :],
                mask=s_ok[:, None], other=0.0)
    if PREFIX:
        # The shared prefix's partial, read only for a row in a group (otherwise its max is -inf).
        # The context holds at least one token, in a split or in the prefix, so m_all is finite.
        has_prefix = tl.load(PL_ptr + b) > 0
        m_p = tl.load(PM_ptr + row, mask=has_prefix, other=float("-inf"))
        m_all = tl.maximum(tl.max(m, 0), m_p)
    else:
        # Split 0 always holds the first token, so m_all is finite.
        m_all = tl.max(m, 0)
    w = tl.exp2(m - m_all)  # empty parts weigh exp2(-inf) = 0
    num, den = tl.sum(w[:, None] * o, 0), tl.sum(w * l, 0)
    if PREFIX:
        w_p = tl.exp2(m_p - m_all)
        num += w_p * tl.load(PO_ptr + row * HEAD_DIM + d, mask=has_prefix, other=0.0)
        den += w_p * tl.load(PS_ptr + row, mask=has_prefix, other=0.0)
    out = num / den
    tl.store(Out_ptr + b * stride_outb + hq * stride_outh + d, out.to(Out_ptr.dtype.element_ty))


def _tiles(device: torch.device) -> _Tiles:
    return _TILES_CUDA if device.type == "cuda" else _TILES_INTERPRET


def _num_splits(B: int, Hkv: int, max_tokens: int, tiles: _Tiles, device: torch.device) -> int:
    """Splits of stage 1 from shapes only: about one full wave of programs, never below
    `min_split_tokens` a split."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    by_load = round(tiles.programs_per_sm * sms / max(B * Hkv, 1))
    by_length = max_tokens // tiles.min_split_tokens
    return max(1, min(by_load, by_length, _MAX_SPLITS))


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"paged_decode_attention: q must be [B, Hq, D] and k_cache, v_cache one "
                         f"[num_blocks, block_size, Hkv, D] shape; got q {tuple(q.shape)}, k_cache "
                         f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D or Hkv == 0 or Hq % Hkv:
        raise ValueError(f"paged_decode_attention: q [B, Hq={Hq}, D={D}] does not fit the pool "
                         f"[.., .., Hkv={Hkv}, D={k_cache.shape[3]}] (Hq must be a multiple of Hkv)")
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(f"paged_decode_attention: q, k_cache, v_cache must share one dtype; got "
                         f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or block_tables.dtype != torch.int32:
        raise ValueError(f"paged_decode_attention: block_tables must be [B={B}, max_blocks] int32; "
                         f"got {tuple(block_tables.shape)} {block_tables.dtype}")
    if context_lens.shape != (B,) or context_lens.dtype != torch.int32:
        raise ValueError(f"paged_decode_attention: context_lens must be [B={B}] int32; got "
                         f"{tuple(context_lens.shape)} {context_lens.dtype}")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, context_lens)}
    if len(devices) != 1:
        raise ValueError(f"paged_decode_attention: all inputs must be on one device; got {devices}")


def _check_shared(shared: SharedPrefix, q: torch.Tensor, k_cache: torch.Tensor) -> None:
    """Shapes, dtypes and devices of a SharedPrefix (its data: `_check_shared_groups`)."""
    B, Hq = q.shape[:2]
    for name in ("prefix_lens", "group_rows"):
        t = getattr(shared, name)
        if t.shape != (B,) or t.dtype != torch.int32 or t.device != q.device or not t.is_contiguous():
            raise ValueError(f"paged_decode_attention: shared.{name} must be a contiguous [B={B}] int32 tensor "
                             f"on {q.device}; got {tuple(t.shape)} {t.dtype} on {t.device}")
    G = Hq // k_cache.shape[2]
    if not 1 <= shared.max_group_rows or shared.max_group_rows * G > _MAX_PREFIX_ROWS:
        raise ValueError(f"paged_decode_attention: shared.max_group_rows = {shared.max_group_rows} must be >= 1 "
                         f"and its rows times the {G} query heads per KV head at most {_MAX_PREFIX_ROWS}")


def _check_shared_groups(shared: SharedPrefix, block_tables: torch.Tensor, context_lens: torch.Tensor,
                         block_size: int) -> None:
    """The SharedPrefix invariants (its docstring), read on the host: the eager twin's check on CPU
    (on a GPU it would be a sync per call, and the kernels do not check their inputs' data)."""
    lens, rows, ctx = shared.prefix_lens.tolist(), shared.group_rows.tolist(), context_lens.tolist()
    covered = [False] * len(lens)
    for b, n in enumerate(rows):
        if n == 0:
            continue
        if not 1 <= n <= shared.max_group_rows or b + n > len(lens):
            raise ValueError(f"paged_decode_attention: shared.group_rows[{b}] = {n} must be in "
                             f"[1, max_group_rows = {shared.max_group_rows}] and end inside the batch of {len(lens)}")
        width = lens[b] // block_size
        for r in range(b, b + n):
            if covered[r] or lens[r] != lens[b] or not torch.equal(block_tables[r, :width], block_tables[b, :width]):
                raise ValueError(f"paged_decode_attention: row {r} of the group at row {b} must be in no other "
                                 f"group, share its prefix length {lens[b]} and its first {width} table entries")
            covered[r] = True
    for b, (n_prefix, n_ctx) in enumerate(zip(lens, ctx)):
        if n_prefix % block_size or not 0 <= n_prefix <= n_ctx or (n_prefix > 0) != covered[b]:
            raise ValueError(f"paged_decode_attention: shared.prefix_lens[{b}] = {n_prefix} must be a multiple of "
                             f"the block size {block_size} in [0, context {n_ctx}], and above 0 exactly for rows "
                             f"in a group")


def _check_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
    D = q.shape[2]
    if D < 16 or D > 256 or D & (D - 1):
        raise ValueError(f"paged_decode_attention(impl='triton'): head dim must be a power of two "
                         f"in 16..256, got {D}")
    if q.shape[1] // k_cache.shape[2] > 128:
        raise ValueError(f"paged_decode_attention(impl='triton'): at most 128 query heads per KV "
                         f"head, got {q.shape[1] // k_cache.shape[2]}")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("paged_decode_attention(impl='triton'): the last dimension of q, k_cache "
                         "and v_cache must be contiguous")
    if block_tables.stride(1) != 1 or not context_lens.is_contiguous():
        raise ValueError("paged_decode_attention(impl='triton'): block_tables rows and "
                         "context_lens must be contiguous")
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"paged_decode_attention(impl='triton') takes bf16, fp16 or fp32, got {q.dtype}")
    if q.device.type == "cpu" and q.dtype != torch.float32:
        raise ValueError("paged_decode_attention(impl='triton') on CPU (TRITON_INTERPRET=1) needs "
                         f"fp32 inputs, got {q.dtype}; use impl='eager'")


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
            num_splits: int | None, tiles: _Tiles, pdl: bool, shared: SharedPrefix | None) -> torch.Tensor:
    """Runs the prefix kernel (with `shared`), stage 1, and stage 2 with more than one split;
    returns out [B, Hq, D] in q's dtype."""
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if B == 0:
        return out
    S = num_splits or _num_splits(B, Hkv, block_tables.shape[1] * block_size, tiles, q.device)
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 inputs: a true fp32 dot (tf32 costs ~1e-3)
    common = dict(BLOCK_SIZE=block_size, HEAD_DIM=D, BLOCK_N=tiles.block_n, DOT_PREC=dot_prec, PDL=pdl,
                  **pdl_launch(pdl))
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0))
    if shared is not None:
        p_max, p_sum = (torch.empty((B, Hq), dtype=torch.float32, device=q.device) for _ in range(2))
        p_out = torch.empty((B, Hq, D), dtype=torch.float32, device=q.device)
        prefix = (shared.prefix_lens, p_max, p_sum, p_out)
        _paged_decode_prefix_kernel[(B, Hkv)](
            q, k_cache, v_cache, block_tables, shared.prefix_lens, shared.group_rows, p_max, p_sum, p_out, B,
            *strides, scale * _LOG2E, G,
            BLOCK_R=max(16, triton.next_power_of_2(shared.max_group_rows * G)),
            num_warps=tiles.prefix_warps, num_stages=tiles.num_stages, **common,
        )
    else:
        prefix = (context_lens,) * 4  # unused (PREFIX off)
    if S > 1:
        work = torch.empty((B, Hq, S, D), dtype=torch.float32, device=q.device)
        m, l = (torch.empty((B, Hq, S), dtype=torch.float32, device=q.device) for _ in range(2))
        dst, dst_strides = work, (work.stride(0), work.stride(1), work.stride(2))
    else:
        m = l = out  # unused: stage 1 writes the output directly
        dst, dst_strides = out, (out.stride(0), out.stride(1), 0)
    _paged_decode_split_kernel[(B, Hkv, S)](
        q, k_cache, v_cache, block_tables, context_lens, dst, m, l, *prefix, *strides, *dst_strides,
        scale * _LOG2E, G, S, BLOCK_G=max(16, triton.next_power_of_2(G)), SPLIT=S > 1, PREFIX=shared is not None,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **common,
    )
    if S > 1:
        _paged_decode_combine_kernel[(B, Hq)](
            work, m, l, *prefix, out, out.stride(0), out.stride(1), S,
            HEAD_DIM=D, BLOCK_S=triton.next_power_of_2(S), PREFIX=shared is not None, PDL=pdl, num_warps=1,
            **pdl_launch(pdl),
        )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
    impl: str = "triton",
    num_splits: int | None = None,
    pdl: bool = False,
    shared: SharedPrefix | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged K/V context (decode step).

    No host sync and no allocation that depends on data: capturable in a CUDA graph.

    Args:
        q: [B, Hq, D] bf16/fp16/fp32 (fp32 only on CPU, under TRITON_INTERPRET=1).
        k_cache: [num_blocks, block_size, Hkv, D] same dtype: one layer's key pool.
        v_cache: same shape and dtype: the value pool.
        block_tables: [B, max_blocks] int32, each sequence's block ids in order; entries past
            its length are never read.
        context_lens: [B] int32 in [1, max_blocks * block_size], the tokens of each sequence in
            the pool, the current token's included (it sees all of them).
        scale: softmax scale, default D ** -0.5.
        impl: "triton" (the kernels) or "eager" (`paged_decode_attention_eager`).
        num_splits: splits of the context per sequence (> 0); None picks it from the shapes.
        pdl: launch with programmatic dependent launch (`common.pdl_available` devices): each
            kernel waits for the one before it first thing, so only its launch overlaps that kernel.
        shared: groups of rows sharing their first K/V blocks (`SharedPrefix`), whose prefix the
            prefix kernel reads once per group; the result is the same function, summed in
            another order. Its data is not checked on this path (the eager twin checks it on CPU).

    Returns:
        out: [B, Hq, D] in q's dtype.
    """
    if impl not in IMPLS:
        raise ValueError(f"paged_decode_attention: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "eager":
        return paged_decode_attention_eager(q, k_cache, v_cache, block_tables, context_lens,
                                            scale=scale, num_splits=num_splits, pdl=pdl, shared=shared)
    _check_inputs(q, k_cache, v_cache, block_tables, context_lens)
    _check_triton(q, k_cache, v_cache, block_tables, context_lens)
    if shared is not None:
        _check_shared(shared, q, k_cache)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"paged_decode_attention: num_splits must be >= 1, got {num_splits}")
    check_pdl("paged_decode_attention", pdl, q.device)
    scale = q.shape[2] ** -0.5 if scale is None else scale
    return _launch(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, _tiles(q.device), pdl,
                   shared)


def _eager_chunk(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """out [b, Hq, D] of a chunk of b sequences, by gathering their blocks (fp32 or fp64 math)."""
    b, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    L = block_tables.shape[1] * block_size
    valid = torch.arange(L, device=q.device)[None, :] < context_lens[:, None]  # (b, L)
    # Table entries past a sequence's length may hold anything: point them at block 0, then mask.
    table = torch.where(valid[:, ::block_size], block_tables, 0).long()  # (b, max_blocks)
    dtype = torch.promote_types(q.dtype, torch.float32)
    keep = valid[:, :, None, None]
    # Zero the masked slots (stale NaN there would survive a zero probability).
    k = torch.where(keep, k_cache[table].view(b, L, Hkv, D), 0).to(dtype)  # (b, L, Hkv, D)
    v = torch.where(keep, v_cache[table].view(b, L, Hkv, D), 0).to(dtype)
    qg = q.reshape(b, Hkv, Hq // Hkv, D).to(dtype)  # (b, Hkv, G, D): q head i reads kv head i // G
    s = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    o = torch.einsum("bhgl,blhd->bhgd", s.softmax(-1), v)  # (b, Hkv, G, D)
    return o.reshape(b, Hq, D).to(q.dtype)


def paged_decode_attention_eager(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
    impl: str = "eager",
    num_splits: int | None = None,
    pdl: bool = False,
    shared: SharedPrefix | None = None,
) -> torch.Tensor:
    """The plain-PyTorch twin of `paged_decode_attention` (the CPU path and the test oracle;
    ``pdl``, a launch option, changes nothing here; nor does ``shared``, the same function read
    another way, whose groups it checks on CPU: `_check_shared_groups`).

    Gathers each chunk of sequences' blocks into [b, L, Hkv, D] and attends in fp32 (fp64 for
    fp64 inputs), a chunk of sequences at a time so memory stays near `_EAGER_CHUNK_ELEMS`
    elements per gathered pool. On CPU it reads context_lens to gather only the blocks in use
    (on a GPU that would be a host sync, so there the whole table is gathered). Same arguments
    and return as `paged_decode_attention`; `num_splits` is accepted and has no effect.
    """
    if impl != "eager":
        raise ValueError(f"paged_decode_attention_eager: impl must be 'eager', got {impl!r}")
    _check_inputs(q, k_cache, v_cache, block_tables, context_lens)
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    max_blocks = block_tables.shape[1]
    in_range = (context_lens >= 1) & (context_lens <= max_blocks * block_size)
    torch._assert_async(in_range.all(), "paged_decode_attention: context_lens must be in "
                        f"[1, max_blocks * block_size = {max_blocks * block_size}]")
    scale = D ** -0.5 if scale is None else scale
    if shared is not None:
        _check_shared(shared, q, k_cache)
        if q.device.type == "cpu":
            _check_shared_groups(shared, block_tables, context_lens, block_size)
    if q.device.type == "cpu" and B > 0:
        max_blocks = triton.cdiv(int(context_lens.max()), block_size)
    out = torch.empty_like(q)
    rows = max(1, _EAGER_CHUNK_ELEMS // max(max_blocks * block_size * Hkv * D, 1))
    for b0 in range(0, B, rows):
        sl = slice(b0, b0 + rows)
        out[sl] = _eager_chunk(q[sl], k_cache, v_cache, block_tables[sl, :max_blocks],
                               context_lens[sl], scale)
    return out
