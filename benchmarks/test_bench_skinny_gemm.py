"""The decoder layer's four projections at a few dozen tokens: oreal_fast.kernels.skinny_linear against
the cuBLAS path the engine runs there.

Run: `pytest benchmarks/test_bench_skinny_gemm.py --benchmark-only` (CUDA only).
Qwen2.5-0.5B shapes, bf16, random weights: q|k|v [1152, 896] with bias, o [896, 896], gate|up
[9728, 896] with SwiGLU, down [896, 4864]; T tokens in 2, 4, 8, 16, 32, 64 and 128 (two token tiles).
Providers:
  cublas          what the engine's plain layers run: F.linear (addmm with the bias), then
                  trunk_inference.silu_mul for gate|up
  oreal_fast      skinny_linear: q|k|v rounded, o and down as fp32 partial sums over SPLITS of K,
                  gate|up with SwiGLU in its epilogue
  oreal_fast_pdl  the same launched with programmatic dependent launch (Hopper and later)
  oreal_fast_k64, oreal_fast_k256  oreal_fast with K tiles of 64 or 256 columns (the default: 128)
  oreal_fast_s2, oreal_fast_w8, oreal_fast_p2, oreal_fast_r128  oreal_fast with 2 pipeline stages (so two
                  programs fit a multiprocessor's shared memory), 8 warps, 2 programs per multiprocessor
                  (fewer rows a program), or up to 128 rows a program: the tiles to try where the
                  default loses to cuBLAS (gate|up from 32 tokens)
Every call is timed inside a CUDA graph of CALLS calls of the projection (the weights, 2-17 MB, stay
in L2 only for the smallest ones: `weight_mb` says which). extra_info: us (median per call), T,
projection, weight_mb, gb_per_s (the weight bytes over that time), copy_gb_per_s (a device-to-device
copy measured in the same session, read + write bytes).
"""

import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from test_bench_paged_attention import copy_gb_per_s, graph_of  # noqa: F401 (copy_gb_per_s: a fixture)

from oreal_fast.kernels.common import pdl_available
from oreal_fast.kernels import skinny_gemm
from oreal_fast.kernels.skinny_gemm import skinny_linear
from oreal_fast.kernels.trunk_inference import silu_mul

H, I, QKV = 896, 4864, 1152
# projection -> (rows of W, K, bias, SwiGLU, splits of K for oreal_fast)
PROJECTIONS = {"qkv": (QKV, H, True, False, 1), "o": (H, H, False, False, 2),
               "gate_up": (2 * I, H, False, True, 1), "down": (H, I, False, False, 3)}
TOKENS = (2, 4, 8, 16, 32, 64, 128)
PROVIDERS = ("cublas", "oreal_fast", "oreal_fast_pdl", "oreal_fast_k64", "oreal_fast_k256", "oreal_fast_s2",
             "oreal_fast_w8", "oreal_fast_p2", "oreal_fast_r128")
# a provider's suffix letter -> the `skinny_gemm._Tiles` field its number sets
TILE_FIELDS = {"k": "block_k", "s": "num_stages", "w": "num_warps", "p": "programs_per_sm", "r": "max_rows"}
CALLS = 20


def _call(provider: str, projection: str, T: int):
    rows, K, has_bias, swiglu, splits = PROJECTIONS[projection]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, K, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(rows, K, device="cuda", generator=g, dtype=torch.bfloat16) * K ** -0.5
    b = torch.randn(rows, device="cuda", generator=g, dtype=torch.bfloat16) if has_bias else None
    if provider == "cublas":
        if swiglu:
            return lambda: silu_mul(*F.linear(x, w).chunk(2, dim=-1))
        return lambda: F.linear(x, w, b)
    pdl = provider == "oreal_fast_pdl"
    return lambda: skinny_linear(x, w, b, swiglu=swiglu, splits=splits, pdl=pdl)


@contextlib.contextmanager
def _tiles_of(provider: str):
    """The tiles a provider names (`_k64`: block_k 64, `TILE_FIELDS`) while its calls are captured."""
    default = skinny_gemm._TILES_CUDA
    suffix = provider.removeprefix("oreal_fast_")
    if suffix[:1] in TILE_FIELDS and suffix[1:].isdigit():
        skinny_gemm._TILES_CUDA = dataclasses.replace(default, **{TILE_FIELDS[suffix[0]]: int(suffix[1:])})
    try:
        yield
    finally:
        skinny_gemm._TILES_CUDA = default


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("projection", list(PROJECTIONS))
def test_skinny_linear(benchmark, copy_gb_per_s, projection, T, provider):
    if provider == "oreal_fast_pdl" and not pdl_available(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs compute capability >= 9")
    fn = _call(provider, projection, T)
    with _tiles_of(provider):
        graph = graph_of(fn, CALLS)

    def step():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=20, warmup_rounds=2, iterations=1)
    seconds = benchmark.stats.stats.median / CALLS
    rows, K = PROJECTIONS[projection][:2]
    weight_bytes = rows * K * 2
    benchmark.extra_info.update(projection=projection, T=T, us=seconds * 1e6, weight_mb=weight_bytes / 1e6,
                                gb_per_s=weight_bytes / seconds / 1e9, copy_gb_per_s=copy_gb_per_s)
    graph.reset()
