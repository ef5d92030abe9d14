"""Parity of paged_decode_attention (Triton and eager) with an independent fp64 dense reference.

Each case builds contiguous reference keys/values per sequence and scatters them into randomly
permuted blocks of a pool whose other slots (unused blocks, slots past each context) are NaN;
table entries past each sequence's length point at NaN blocks or hold -1. The fp64 truth is plain
attention over each sequence's own tokens of the contiguous reference, one sequence at a time.
CPU: fp32 under TRITON_INTERPRET=1, small head dims. GPU (skipped without CUDA): bf16 at the
Qwen2.5 shapes, long contexts, CUDA-graph capture.
"""

import importlib

import pytest
import torch

from oreal_fast.kernels import paged_decode_attention, paged_decode_attention_eager

# The module itself (the package re-exports a function of the same name).
pa = importlib.import_module("oreal_fast.kernels.paged_attention")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
NAN = float("nan")


def _cdiv(a, b):
    return -(-a // b)


def _shared_inputs(layout, Hq, Hkv, D, block_size, device, dtype=torch.float32, max_group_rows=8, seed=0):
    """Inputs whose rows come in groups sharing their first blocks, as forked samples of one prompt.

    layout: (prefix_blocks, own_lengths) per group: len(own_lengths) rows whose contexts are the
    group's prefix_blocks * block_size shared tokens (the same pool blocks, the same keys and
    values) and then own_lengths[i] tokens of their own; prefix_blocks 0 makes each row one of no
    group. The pool's other slots are NaN; table entries past a context point at block 0 (NaN)
    or hold -1. Returns q, k_cache, v_cache, block_tables, context_lens, the contiguous reference
    k_ref, v_ref [B, L, Hkv, D] (L = max_blocks * block_size) that the pool holds, the SharedPrefix
    and the context lengths as a list."""
    g = torch.Generator().manual_seed(seed)
    rows = [(p, n) for p, own in layout for n in own]
    lens = [p * block_size + n for p, n in rows]
    assert min(lens, default=1) >= 1, "every context holds a token at least"
    B, max_blocks = len(rows), max((_cdiv(n, block_size) for n in lens), default=0) + 2
    L = max_blocks * block_size
    q = torch.randn(B, Hq, D, generator=g)
    k_ref, v_ref = torch.randn(B, L, Hkv, D, generator=g), torch.randn(B, L, Hkv, D, generator=g)
    num_blocks = 1 + sum(p for p, _ in layout) + sum(_cdiv(p * block_size + n, block_size) - p for p, n in rows)
    ids = iter((1 + torch.randperm(num_blocks - 1, generator=g)).tolist())  # block 0 stays NaN
    tables = torch.tensor([0, -1] * max_blocks, dtype=torch.int32)[:max_blocks].repeat(B, 1)
    prefix_lens, group_rows = torch.zeros(B, dtype=torch.int32), torch.zeros(B, dtype=torch.int32)
    b = 0
    for p, own in layout:
        shared_ids, n_shared = [next(ids) for _ in range(p)], p * block_size
        if p:
            group_rows[b] = len(own)
        for r in range(b, b + len(own)):
            k_ref[r, :n_shared], v_ref[r, :n_shared] = k_ref[b, :n_shared], v_ref[b, :n_shared]
            used = _cdiv(lens[r], block_size)
            tables[r, :used] = torch.tensor(shared_ids + [next(ids) for _ in range(used - p)])
            prefix_lens[r] = n_shared
        b += len(own)
    k_cache = torch.full((num_blocks, block_size, Hkv, D), NAN)
    v_cache = torch.full_like(k_cache, NAN)
    for r, n in enumerate(lens):
        t = torch.arange(n)
        slots = tables[r, t // block_size].long() * block_size + t % block_size
        k_cache.view(-1, Hkv, D)[slots] = k_ref[r, :n]
        v_cache.view(-1, Hkv, D)[slots] = v_ref[r, :n]
    to = dict(device=device)
    shared = pa.SharedPrefix(prefix_lens.to(**to), group_rows.to(**to), max_group_rows)
    return (q.to(dtype=dtype, **to), k_cache.to(dtype=dtype, **to), v_cache.to(dtype=dtype, **to), tables.to(**to),
            torch.tensor(lens, dtype=torch.int32, device=device), k_ref.to(dtype=dtype, **to),
            v_ref.to(dtype=dtype, **to), shared, lens)


def _inputs(lens, Hq, Hkv, D, block_size, device, dtype=torch.float32, seed=0):
    """The first seven of `_shared_inputs` for sequences of no group."""
    return _shared_inputs([(0, lens)], Hq, Hkv, D, block_size, device, dtype, seed=seed)[:7]


def _truth(q, k_ref, v_ref, lens, scale):
    """fp64 attention of each sequence over its first lens[b] reference tokens, [B, Hq, D]."""
    G = q.shape[1] // k_ref.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(lens):
        k = k_ref[b, :n].double().repeat_interleave(G, 1)  # (n, Hq, D)
        v = v_ref[b, :n].double().repeat_interleave(G, 1)
        p = (torch.einsum("hd,nhd->hn", q[b].double(), k) * scale).softmax(-1)
        out[b] = torch.einsum("hn,nhd->hd", p, v)
    return out


def _lowp_reference(q, k_ref, v_ref, lens, scale):
    """Dense attention over the contiguous padded reference as a flash kernel in q's dtype does
    it: fp32 scores and softmax, probabilities rounded to q's dtype for P @ V, output rounded."""
    B, Hq, D = q.shape
    L, Hkv = k_ref.shape[1], k_ref.shape[2]
    keep = torch.arange(L, device=q.device)[None, :] < torch.tensor(lens, device=q.device)[:, None]
    qg = q.float().view(B, Hkv, Hq // Hkv, D)
    s = torch.einsum("bhgd,blhd->bhgl", qg, k_ref.float()) * scale
    p = s.masked_fill(~keep[:, None, None, :], float("-inf")).softmax(-1).to(q.dtype).float()
    o = torch.einsum("bhgl,blhd->bhgd", p, v_ref.float())  # (B, Hkv, G, D)
    return o.reshape(B, Hq, D).to(q.dtype)


def _rel_err(got, ref):
    return float((got.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def _assert_no_worse(name, got, truth, lowp, margin):
    """got's norm-wise relative error against truth is at most lowp's plus margin; on failure,
    names the worst element and all three values."""
    assert torch.isfinite(got).all(), f"{name}: {int((~torch.isfinite(got)).sum())} non-finite outputs"
    err, bound = _rel_err(got, truth), _rel_err(lowp, truth) + margin
    if err > bound:
        worst = (got.double() - truth).abs().argmax()
        idx = tuple(int(i) for i in torch.unravel_index(worst, truth.shape))
        raise AssertionError(f"{name}: relative error {err:.3e} > {bound:.3e} (reference's + margin); "
                             f"worst at {idx}: got {float(got[idx]):.7g}, fp64 {float(truth[idx]):.7g}, "
                             f"low-dtype reference {float(lowp[idx]):.7g}")


def _check(lens, Hq, Hkv, D, block_size, impl, device, dtype=torch.float32, margin=2e-6,
           num_splits=None, scale=None, seed=0):
    q, kc, vc, tables, ctx, k_ref, v_ref = _inputs(lens, Hq, Hkv, D, block_size, device, dtype,
                                                   seed=seed)
    s = D ** -0.5 if scale is None else scale
    out = paged_decode_attention(q, kc, vc, tables, ctx, scale=scale, impl=impl,
                                 num_splits=num_splits)
    assert out.shape == q.shape and out.dtype == q.dtype
    _assert_no_worse(f"{impl} B{len(lens)} Hq{Hq} Hkv{Hkv} D{D} bs{block_size}", out,
                     _truth(q, k_ref, v_ref, lens, s), _lowp_reference(q, k_ref, v_ref, lens, s),
                     margin)


HEADS = [(2, 2), (4, 2), (14, 2)]  # GQA groups 1, 2, 7


@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("Hq,Hkv", HEADS, ids=[f"G{q // kv}" for q, kv in HEADS])
def test_edge_lengths_match_fp64(Hq, Hkv, block_size, impl, device):
    """One token, exactly a block, a block plus one, several blocks: B = 5 (not a power of two)."""
    bs = block_size
    _check([1, bs, bs + 1, 3 * bs + 5, 2], Hq, Hkv, 16, bs, impl, device)


@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize("num_splits", [None, 1, 3, 8])
def test_long_context_in_splits_matches_fp64(num_splits, impl, device):
    """B = 1, 200 tokens over 16-token blocks: 1, 3 or 8 splits (the default picks several)."""
    _check([200], 14, 2, 32, 16, impl, device, num_splits=num_splits)


GROUPS = [(1, 1), (8, 2), (12, 1), (32, 2)]  # G = 1, 4, 12 (a padded dot tile), 16 (a full one) over two KV heads


@pytest.mark.parametrize("num_splits", [None, 1, 4])
@pytest.mark.parametrize("Hq,Hkv", GROUPS, ids=[f"Hq{q}-Hkv{kv}" for q, kv in GROUPS])
def test_random_batches_match_fp64(Hq, Hkv, num_splits, device):
    """Random lengths (a length-1 sequence always among them), partial last blocks, 16-token
    blocks: one split, four, or the shapes' choice."""
    g = torch.Generator().manual_seed(Hq * 100 + Hkv + (num_splits or 0))
    lens = [1] + torch.randint(1, 90, (5,), generator=g).tolist()
    _check(lens, Hq, Hkv, 16, 16, "triton", device, num_splits=num_splits, seed=int(g.initial_seed()))


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_empty_splits_are_neutral(impl, device):
    """More splits than a short sequence has tiles: the empty ones must not add NaN or weight."""
    _check([1, 17, 3], 4, 2, 16, 16, impl, device, num_splits=16)


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_explicit_scale(impl, device):
    _check([40, 9], 4, 2, 16, 16, impl, device, scale=0.7, num_splits=2)


def test_default_splits_come_from_shapes():
    cpu = torch.device("cpu")
    tiles = pa._TILES_INTERPRET
    target = tiles.programs_per_sm  # the interpreter counts one SM
    # A table spanning one split's minimum takes one split, whatever the batch.
    assert pa._num_splits(1, 2, tiles.min_split_tokens, tiles, cpu) == 1
    # A long table at a small batch takes about one wave of programs; a batch that fills it takes one.
    assert pa._num_splits(1, 2, 64 * tiles.min_split_tokens, tiles, cpu) == target // 2
    assert pa._num_splits(3, 1, 64 * tiles.min_split_tokens, tiles, cpu) == round(target / 3)
    assert pa._num_splits(target, 1, 64 * tiles.min_split_tokens, tiles, cpu) == 1
    assert pa._num_splits(4 * target, 2, 64 * tiles.min_split_tokens, tiles, cpu) == 1


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_empty_batch(impl, device):
    q, kc, vc, tables, ctx, *_ = _inputs([], 4, 2, 16, 16, device)
    out = paged_decode_attention(q, kc, vc, tables, ctx, impl=impl)
    assert out.shape == (0, 4, 16)


def test_eager_in_several_chunks(monkeypatch, device):
    monkeypatch.setattr(pa, "_EAGER_CHUNK_ELEMS", 2 * 64 * 2 * 16)  # 2 sequences per chunk
    _check([1, 16, 17, 50, 2], 4, 2, 16, 16, "eager", device)


def test_eager_rejects_context_past_the_table():
    q, kc, vc, tables, ctx, *_ = _inputs([5, 20], 4, 2, 16, 16, "cpu")
    ctx[1] = tables.shape[1] * 16 + 1
    with pytest.raises(RuntimeError, match="context_lens must be in"):
        paged_decode_attention_eager(q, kc, vc, tables, ctx)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(block_tables=lambda t: t.long()), "block_tables must be \\[B=2, max_blocks\\] int32"),
        (dict(context_lens=lambda c: c[:1]), "context_lens must be \\[B=2\\] int32"),
        (dict(q=lambda q: q[:, :3]), "Hq must be a multiple of Hkv"),
        (dict(v_cache=lambda v: v.double()), "must share one dtype"),
        (dict(q=lambda q: q[..., :12], k_cache=lambda k: k[..., :12].contiguous(),
              v_cache=lambda v: v[..., :12].contiguous()), "power of two"),
        (dict(k_cache=lambda k: k.transpose(1, 3).contiguous().transpose(1, 3)), "must be contiguous"),
        (dict(impl="cuda"), "impl must be one of"),
        (dict(num_splits=0), "num_splits must be >= 1"),
        (dict(pdl=True), "pdl=True needs a CUDA device of compute capability >= 9"),
    ],
    ids=["table_dtype", "lens_shape", "heads", "dtype", "head_dim", "contiguity", "impl", "splits", "pdl"],
)
def test_bad_arguments_name_the_fault(change, match):
    q, kc, vc, tables, ctx, *_ = _inputs([5, 20], 4, 2, 16, 16, "cpu")
    args = dict(q=q, k_cache=kc, v_cache=vc, block_tables=tables, context_lens=ctx)
    kwargs = {}
    for key, value in change.items():
        if key in args:
            args[key] = value(args[key])
        else:
            kwargs[key] = value
    with pytest.raises(ValueError, match=match):
        paged_decode_attention(*args.values(), **kwargs)


# ----------------------------------------------------------------------------- shared prefixes


# groups of 3 (a 2-block prefix), of 4 (one row's context is its prefix alone), of 1; rows of no group
SHARED_LAYOUT = [(2, [5, 20, 1]), (0, [30]), (3, [0, 7, 16, 2]), (1, [9]), (0, [1, 40])]


def _check_shared(layout, Hq, Hkv, D, block_size, impl, device, dtype=torch.float32, margin=2e-6,
                  num_splits=None, max_group_rows=8, seed=0):
    q, kc, vc, tables, ctx, k_ref, v_ref, shared, lens = _shared_inputs(
        layout, Hq, Hkv, D, block_size, device, dtype, max_group_rows=max_group_rows, seed=seed)
    out = paged_decode_attention(q, kc, vc, tables, ctx, impl=impl, num_splits=num_splits, shared=shared)
    assert out.shape == q.shape and out.dtype == q.dtype
    s = D ** -0.5
    _assert_no_worse(f"{impl} shared B{len(lens)} Hq{Hq} Hkv{Hkv} D{D} bs{block_size}", out,
                     _truth(q, k_ref, v_ref, lens, s), _lowp_reference(q, k_ref, v_ref, lens, s), margin)


@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("Hq,Hkv", HEADS, ids=[f"G{q // kv}" for q, kv in HEADS])
def test_shared_prefix_matches_fp64(Hq, Hkv, block_size, num_splits, impl, device):
    """Groups read their prefix once (the prefix kernel) and their own tokens per row, merged in
    the one-split kernel or in the combining kernel; rows of no group as without `shared`."""
    _check_shared(SHARED_LAYOUT, Hq, Hkv, 16, block_size, impl, device, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [None, 2])
def test_shared_prefix_fills_the_dot_tile(num_splits, device):
    """Groups of max_group_rows rows at G = 7: the prefix kernel's tile of 16 * 7 = 112 rows, padded
    to 128; a group ending at the batch's last row."""
    g = torch.Generator().manual_seed(7)
    own = lambda n: torch.randint(1, 40, (n,), generator=g).tolist()  # noqa: E731
    _check_shared([(3, own(16)), (0, own(2)), (2, own(16))], 14, 2, 16, 16, "triton", device,
                  num_splits=num_splits, max_group_rows=16, seed=3)


def test_a_group_fills_the_prefix_tile_with_its_query_heads():
    assert pa.max_group_rows(14, 2) == 18  # Qwen2.5-0.5B: 18 x 7 = 126 of 128 rows
    assert pa.max_group_rows(8, 8) == 128 and pa.max_group_rows(128, 1) == 1


def test_shared_prefix_of_one_group_equals_the_plain_kernel(device):
    """The same inputs with and without `shared` agree to fp32 round-off (the sums' order differs)."""
    q, kc, vc, tables, ctx, *_, shared, _ = _shared_inputs([(4, [3, 50, 17])], 8, 2, 16, 16, device)
    plain = paged_decode_attention(q, kc, vc, tables, ctx)
    torch.testing.assert_close(paged_decode_attention(q, kc, vc, tables, ctx, shared=shared), plain,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda s, t: pa.SharedPrefix(s.prefix_lens.long(), s.group_rows, 8), "prefix_lens must be a contiguous"),
        (lambda s, t: pa.SharedPrefix(s.prefix_lens, s.group_rows[:-1], 8), "group_rows must be a contiguous"),
        (lambda s, t: pa.SharedPrefix(s.prefix_lens, s.group_rows, 33), "at most 128"),
        (lambda s, t: pa.SharedPrefix(s.prefix_lens, s.group_rows, 2), r"group_rows\[0\] = 3 must be in"),
        (lambda s, t: pa.SharedPrefix(s.prefix_lens + 1, s.group_rows, 8), "must be a multiple of the block size"),
        (lambda s, t: pa.SharedPrefix(s.prefix_lens, torch.zeros_like(s.group_rows), 8), "exactly for rows in a group"),
        (lambda s, t: pa.SharedPrefix(s.prefix_lens, s.group_rows.roll(1), 8), "row 3 of the group at row 1"),
        (lambda s, t: pa.SharedPrefix(s.prefix_lens, s.group_rows + torch.tensor([0, 2, 0, 0], dtype=torch.int32),
                                      8), "row 1 of the group at row 1 must be in no other group"),
        (lambda s, t: t.__setitem__((1, 0), t[1, 0] + 1), "row 1 of the group at row 0 must"),
    ],
    ids=["lens_dtype", "rows_shape", "tile", "too_many_rows", "not_blocks", "no_group", "prefix_differs", "overlap",
         "tables_differ"],
)
def test_bad_shared_prefixes_name_the_fault(change, match):
    """Shapes on both paths; the groups' data by the eager twin on CPU (the kernels read it as given)."""
    q, kc, vc, tables, ctx, *_, shared, _ = _shared_inputs([(2, [5, 20, 1]), (0, [30])], 8, 2, 16, 8, "cpu")
    changed = change(shared, tables)
    shared = changed if changed is not None else shared
    with pytest.raises(ValueError, match=match):
        paged_decode_attention_eager(q, kc, vc, tables, ctx, shared=shared)


# GPU: bf16 at real shapes. The margin is about a fifth of bf16's rounding of one output (2^-9).
BF16_MARGIN = 4e-4
REAL_HEADS = [(14, 2, 64), (28, 4, 128), (8, 8, 64)]  # Qwen2.5-0.5B, Qwen2.5-7B, no GQA


@needs_cuda
@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("Hq,Hkv,D", REAL_HEADS, ids=[f"Hq{q}-Hkv{kv}-D{d}" for q, kv, d in REAL_HEADS])
def test_bf16_real_shapes_match_fp64(Hq, Hkv, D, block_size, impl, poison_cuda_allocator):
    bs = block_size
    g = torch.Generator().manual_seed(1)
    lens = [1, bs, bs + 1, 16384, 5000, 3 * bs + 7] + torch.randint(1, 3000, (7,), generator=g).tolist()
    q, kc, vc, tables, ctx, k_ref, v_ref = _inputs(lens, Hq, Hkv, D, bs, "cuda", torch.bfloat16)
    poison_cuda_allocator()
    out = paged_decode_attention(q, kc, vc, tables, ctx, impl=impl)
    torch.cuda.synchronize()
    s = D ** -0.5
    _assert_no_worse(f"{impl} bf16 Hq{Hq} Hkv{Hkv} D{D} bs{bs}", out, _truth(q, k_ref, v_ref, lens, s),
                     _lowp_reference(q, k_ref, v_ref, lens, s), BF16_MARGIN)


@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 2, 7, 32])
def test_bf16_forced_splits_match_fp64(num_splits, poison_cuda_allocator):
    lens = [16384, 1, 700, 64, 65]
    q, kc, vc, tables, ctx, k_ref, v_ref = _inputs(lens, 14, 2, 64, 16, "cuda", torch.bfloat16)
    poison_cuda_allocator()
    out = paged_decode_attention(q, kc, vc, tables, ctx, num_splits=num_splits)
    torch.cuda.synchronize()
    _assert_no_worse(f"bf16 splits{num_splits}", out, _truth(q, k_ref, v_ref, lens, 0.125),
                     _lowp_reference(q, k_ref, v_ref, lens, 0.125), BF16_MARGIN)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_dtypes_match_fp64(dtype):
    lens = [1, 63, 64, 65, 4000, 2]
    q, kc, vc, tables, ctx, k_ref, v_ref = _inputs(lens, 14, 2, 64, 64, "cuda", dtype)
    out = paged_decode_attention(q, kc, vc, tables, ctx)
    _assert_no_worse(f"{dtype}", out, _truth(q, k_ref, v_ref, lens, 0.125),
                     _lowp_reference(q, k_ref, v_ref, lens, 0.125),
                     BF16_MARGIN if dtype == torch.float16 else 2e-6)


@needs_cuda
def test_cuda_graph_replay_reads_inputs_on_device():
    """Captured over other queries, tables and lengths, then replayed after the real ones are
    copied in place: the output follows what the tensors hold at replay."""
    lens = [2500, 7, 4096, 1]
    q, kc, vc, tables, ctx, k_ref, v_ref = _inputs(lens, 14, 2, 64, 16, "cuda", torch.bfloat16)
    real = q.clone(), tables.clone(), ctx.clone()
    paged_decode_attention(q, kc, vc, tables, ctx)  # compile outside the capture
    torch.cuda.synchronize()
    q.zero_()
    tables.zero_()
    ctx.fill_(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_decode_attention(q, kc, vc, tables, ctx)
    for dst, src in zip((q, tables, ctx), real):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    _assert_no_worse("graph replay", out, _truth(q, k_ref, v_ref, lens, 0.125),
                     _lowp_reference(q, k_ref, v_ref, lens, 0.125), BF16_MARGIN)


@needs_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 4])
@pytest.mark.parametrize("Hq,Hkv,D", REAL_HEADS[:2], ids=[f"Hq{q}-Hkv{kv}-D{d}" for q, kv, d in REAL_HEADS[:2]])
def test_bf16_shared_prefix_matches_fp64(Hq, Hkv, D, num_splits, poison_cuda_allocator):
    """As the engine runs the official rollout: groups of 16 samples sharing a 37-block (592-token)
    prompt, a group of 5 whose others stopped, rows of no group (recomputed after preemption)."""
    g = torch.Generator().manual_seed(5)
    own = lambda n, hi: torch.randint(1, hi, (n,), generator=g).tolist()  # noqa: E731
    layout = [(37, own(16, 2000)), (0, own(3, 3000)), (37, own(16, 300)), (37, own(5, 9000)), (0, [1])]
    q, kc, vc, tables, ctx, k_ref, v_ref, shared, lens = _shared_inputs(
        layout, Hq, Hkv, D, 16, "cuda", torch.bfloat16, max_group_rows=16)
    poison_cuda_allocator()
    out = paged_decode_attention(q, kc, vc, tables, ctx, num_splits=num_splits, shared=shared)
    torch.cuda.synchronize()
    s = D ** -0.5
    _assert_no_worse(f"bf16 shared Hq{Hq} D{D} splits{num_splits}", out, _truth(q, k_ref, v_ref, lens, s),
                     _lowp_reference(q, k_ref, v_ref, lens, s), BF16_MARGIN)


@needs_cuda
def test_shared_prefix_in_a_cuda_graph_reads_the_groups_on_device():
    """Captured with no group (every row alone), replayed after the groups are copied in place."""
    q, kc, vc, tables, ctx, k_ref, v_ref, shared, lens = _shared_inputs(
        [(37, [5, 700, 40, 1200]), (0, [900])], 14, 2, 64, 16, "cuda", torch.bfloat16, max_group_rows=16)
    real = shared.prefix_lens.clone(), shared.group_rows.clone()
    paged_decode_attention(q, kc, vc, tables, ctx, shared=shared)  # compile outside the capture
    torch.cuda.synchronize()
    shared.prefix_lens.zero_()
    shared.group_rows.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_decode_attention(q, kc, vc, tables, ctx, shared=shared)
    shared.prefix_lens.copy_(real[0])
    shared.group_rows.copy_(real[1])
    graph.replay()
    torch.cuda.synchronize()
    _assert_no_worse("shared graph replay", out, _truth(q, k_ref, v_ref, lens, 0.125),
                     _lowp_reference(q, k_ref, v_ref, lens, 0.125), BF16_MARGIN)
