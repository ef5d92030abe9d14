"""Decode attention benchmarks: oreal_fast.kernels.paged_decode_attention beside another commit's
version and a dense peer.

Run: `pytest benchmarks/test_bench_paged_attention.py --benchmark-only` (CUDA only).
Qwen2.5-0.5B attention shapes (Hq 14, Hkv 2, D 64, bf16), one query token per sequence, every
sequence at the case's context length, 16-token blocks (the engine's default) in a random
permutation of the pool, as after a while of allocation and freeing. Cases: the decode grid of
the rollout-engine issue (live batch @ context); `table` is the block table's span: `tight` (the
context) or `wide` (16384 tokens, the official max length: the engine's tables span its max
model length, and the split count follows the span), or `shared`: tight tables where each run of
GROUP consecutive sequences (the samples of one prompt, admitted together) shares its first
SHARED_BLOCKS blocks (a 592-token prompt, the prefix cache's whole blocks of the official
600-token prompt) and owns the rest, as the engine's prefix cache lays out the official rollout.
A `shared` case beside its `tight` twin shows how much of the shared prompt's K/V the GPU's L2
already serves once per group (a kernel that reads it once per group on purpose would save at most
the difference between `gb` and `gb_unique`).
Providers:
  oreal_fast  paged_decode_attention (the Triton kernels)
  oreal_fast_shared  the same with `shared` (`SharedPrefix`: each group's prompt read once, by the
              prefix kernel); `shared` cases only
  baseline    the same file of the oreal_fast under $BASELINE_ROOT (benchmarks/baseline.py; skipped
              without it)
  sdpa_dense  torch SDPA over a contiguous [B, L, Hkv, D] cache exactly L long (no paging, no
              mask: the peer's best case)
Every call is timed inside a CUDA graph of `CALLS` calls, so the small cases measure the GPU, not
the launch path. Each case records extra_info: `us` (median per call), `gb_per_s` (bytes of K and
V the call must read, 2 * B * L * Hkv * D * 2, over that time), `gb_unique` (the distinct blocks'
bytes: less than `gb` only in `shared` cases), `copy_gb_per_s` (a device-to-device
copy measured in the same session, read + write bytes) and `frac_of_copy`. Small cases (under
~50 MB of K/V) sit in the 50-60 MB L2 between calls, so their rate can exceed HBM bandwidth.
"""

import importlib

import pytest
import torch
import torch.nn.functional as F

import gpu_timing
from baseline import baseline_module
from oreal_fast.kernels import paged_decode_attention

pa = importlib.import_module("oreal_fast.kernels.paged_attention")

HQ, HKV, D, BLOCK = 14, 2, 64, 16
WIDE_TABLE = 16384
CASES = [(1, 128, "tight"), (16, 128, "tight"), (64, 128, "tight"), (256, 128, "tight"),
         (256, 2048, "tight"), (64, 8192, "tight"), (1, 128, "wide"), (256, 128, "wide"),
         (256, 2048, "shared"), (64, 8192, "shared"), (1024, 1024, "tight"), (1024, 1024, "shared"),
         (16, 2048, "tight"), (16, 2048, "shared")]
GROUP, SHARED_BLOCKS = 16, 37
PROVIDERS = ("oreal_fast", "oreal_fast_shared", "baseline", "sdpa_dense")
CALLS = 20


@pytest.fixture(scope="session")
def copy_gb_per_s() -> float:
    """Device-to-device copy rate of 1 GiB, read + write bytes (`gpu_timing.copy_gb_per_s`)."""
    return gpu_timing.copy_gb_per_s()


def graph_of(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of fn (after one warm-up call that compiles)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def _shared_blocks(B: int, L: int, table: str) -> int:
    """Leading blocks each sequence shares with its group (0 unless `table` is `shared`)."""
    return min(SHARED_BLOCKS, L // BLOCK - 1) if table == "shared" else 0


def _paged(B: int, L: int, table_tokens: int, shared: int, g: torch.Generator):
    """q [B, Hq, D], K/V pools in random block order, tables [B, table_tokens / 16], lens [B] = L;
    each run of GROUP rows points its first `shared` entries at the same blocks."""
    used = L // BLOCK
    groups = -(-B // GROUP)
    num_blocks = groups * shared + B * (used - shared)
    q = torch.randn(B, HQ, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(num_blocks, BLOCK, HKV, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ids = torch.randperm(num_blocks, device="cuda", generator=g).int()
    tables = torch.zeros(B, table_tokens // BLOCK, dtype=torch.int32, device="cuda")
    tables[:, :shared] = ids[:groups * shared].view(groups, shared).repeat_interleave(GROUP, 0)[:B]
    tables[:, shared:used] = ids[groups * shared:].view(B, used - shared)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return q, k, v, tables, lens


def _call(provider: str, B: int, L: int, table_tokens: int, shared: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    if provider == "sdpa_dense":
        q = torch.randn(B, HQ, 1, D, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, L, HKV, D, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        return lambda: F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                                      enable_gqa=True)
    args = _paged(B, L, table_tokens, shared, g)
    if provider == "oreal_fast_shared":
        rows = torch.arange(B, dtype=torch.int32, device="cuda")
        group_rows = torch.where(rows % GROUP == 0, (B - rows).clamp(max=GROUP), 0).int()
        prefix = pa.SharedPrefix(torch.full((B,), shared * BLOCK, dtype=torch.int32, device="cuda"), group_rows,
                                 GROUP)
        return lambda: paged_decode_attention(*args, shared=prefix)
    if provider == "oreal_fast":
        fn = paged_decode_attention
    else:
        fn = baseline_module("kernels/paged_attention.py").paged_decode_attention
    return lambda: fn(*args)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("B,L,table", CASES, ids=[f"B{b}-L{n}-{t}" for b, n, t in CASES])
def test_paged_decode_attention(benchmark, copy_gb_per_s, B, L, table, provider):
    if provider == "sdpa_dense" and table != "tight":
        pytest.skip("sdpa_dense has no block table: run once per shape")
    if provider == "oreal_fast_shared" and table != "shared":
        pytest.skip("oreal_fast_shared needs groups: `shared` cases only")
    table_tokens = WIDE_TABLE if table == "wide" else L
    shared = _shared_blocks(B, L, table)
    graph = graph_of(_call(provider, B, L, table_tokens, shared), CALLS)

    def step():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=20, warmup_rounds=2, iterations=1)
    seconds = benchmark.stats.stats.median / CALLS
    gb_per_s = 2 * B * L * HKV * D * 2 / seconds / 1e9
    unique_tokens = -(-B // GROUP) * shared * BLOCK + B * (L - shared * BLOCK)
    benchmark.extra_info.update(B=B, L=L, table_tokens=table_tokens, block_size=BLOCK, us=seconds * 1e6,
                                shared_blocks=shared, gb=2 * B * L * HKV * D * 2 / 1e9,
                                gb_unique=2 * unique_tokens * HKV * D * 2 / 1e9,
                                gb_per_s=gb_per_s, copy_gb_per_s=copy_gb_per_s,
                                frac_of_copy=gb_per_s / copy_gb_per_s)
    if provider.startswith("oreal_fast"):
        benchmark.extra_info["num_splits"] = pa._num_splits(B, HKV, table_tokens, pa._TILES_CUDA,
                                                            torch.device("cuda"))
    graph.reset()  # frees its memory pool before the next case allocates
    torch.cuda.empty_cache()
