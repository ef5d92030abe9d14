"""Decode attention benchmarks: oreal_fast.kernels.paged_decode_attention beside its peers.

Run: `pytest benchmarks/test_bench_paged_attention.py --benchmark-only` (CUDA only).
Qwen2.5-0.5B attention shapes (Hq 14, Hkv 2, D 64, bf16), one query token per sequence, every
sequence at the case's context length; the pool's blocks are a random permutation, as after a
while of allocation and freeing.
Providers:
  oreal_fast  paged_decode_attention (the Triton kernels)
  eager       paged_decode_attention_eager (gather the blocks, fp32 einsum)
  sdpa_dense  torch SDPA over a contiguous [B, L, Hkv, D] cache exactly L = context long (no
              paging, no mask: the peer's best case)
Each case records extra_info["us"] (median time of one call) and extra_info["gb_per_s"] (bytes of
K and V the call must read, 2 * B * L * Hkv * D * 2, over that time). The smallest cases
(64 x 512: 16 MiB of K/V) fit the 60 MB L2, so their rate can exceed HBM bandwidth.
"""

import pytest
import torch
import torch.nn.functional as F

from oreal_fast.kernels import paged_decode_attention, paged_decode_attention_eager

HQ, HKV, D = 14, 2, 64
BATCHES = (64, 256, 1024)
CONTEXTS = (512, 2048, 16384)
BLOCK_SIZES = (16, 64)
PROVIDERS = ("oreal_fast", "eager", "sdpa_dense")
# Calls per timed round: one call of the smaller cases lasts a few microseconds, well under
# the cost of the host synchronisation that ends a round.
CALLS_PER_ROUND = {"oreal_fast": 20, "sdpa_dense": 20, "eager": 1}
# The eager twin at these sizes takes seconds per call, past the suite's budget.
EAGER_MAX_TOKENS = 256 * 2048


def _paged(B: int, L: int, block_size: int, g: torch.Generator):
    """q [B, Hq, D], K/V pools [B * L / bs, bs, Hkv, D] and tables [B, L / bs] (a permutation)."""
    num_blocks = B * L // block_size
    q = torch.randn(B, HQ, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(num_blocks, block_size, HKV, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.randperm(num_blocks, device="cuda", generator=g).int().view(B, L // block_size)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return q, k, v, tables, lens


def _call(provider: str, B: int, L: int, block_size: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    if provider == "sdpa_dense":
        q = torch.randn(B, HQ, 1, D, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, L, HKV, D, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        return lambda: F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                                      enable_gqa=True)
    args = _paged(B, L, block_size, g)
    fn = paged_decode_attention if provider == "oreal_fast" else paged_decode_attention_eager
    return lambda: fn(*args)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("L", CONTEXTS, ids=[f"L{c}" for c in CONTEXTS])
@pytest.mark.parametrize("B", BATCHES, ids=[f"B{b}" for b in BATCHES])
def test_paged_decode_attention(benchmark, B, L, block_size, provider):
    if provider == "sdpa_dense" and block_size != BLOCK_SIZES[0]:
        pytest.skip("sdpa_dense has no blocks: run once per shape")
    if provider == "eager" and B * L > EAGER_MAX_TOKENS:
        pytest.skip(f"eager runs up to {EAGER_MAX_TOKENS} cached tokens")
    fn = _call(provider, B, L, block_size)
    calls = CALLS_PER_ROUND[provider]

    def step():
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()

    rounds = 10 if provider != "eager" else 3
    benchmark.pedantic(step, rounds=rounds, warmup_rounds=1, iterations=1)
    seconds = benchmark.stats.stats.median / calls
    benchmark.extra_info["us"] = seconds * 1e6
    benchmark.extra_info["gb_per_s"] = 2 * B * L * HKV * D * 2 / seconds / 1e9
    benchmark.extra_info.update(B=B, L=L, block_size=block_size)
    del fn
    torch.cuda.empty_cache()
