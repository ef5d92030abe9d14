"""The few-token GEMV layers (`oreal_fast.kernels.decode_gemv`) against the plain layers (cuBLAS
GEMMs + add_rms_norm + rope_write_kv + silu_mul), at the Qwen2.5-0.5B shape in bf16, T tokens per
forward.

Run: `pytest benchmarks/test_bench_decode_gemv.py --benchmark-only` (CUDA only; about a minute).
Cases:
  test_trunk      the 24 layers of an `InferenceModel` (random weights, 0.02 init) without their
                  attention: a stand-in cache ropes q and k and writes k, v into a one-block pool
                  (plain: `rope_write_kv`; gemv: the q|k|v kernel does it) and returns the roped
                  queries as the attention output (no kernel), so a layer is its norms, four
                  projections, rope with the K/V write, and SwiGLU. Providers: `plain`
                  (`Layer.forward`) and `gemv` (`Layer.forward_gemv`). Runs before rope moved into
                  the q|k|v kernel (benchmarks/RESULTS.md, 2026-12-07) left rope out of both.
  test_down_proj  the down projection alone (K 4864 -> N 896, the widest reduction), the 24 layers'
                  own matrices in turn (so no matrix sits in L2 from the call before): cuBLAS
                  `F.linear` against `linear_partials` at several split widths, each followed by
                  the consumer's reduction (`add_rms_norm_partials`; for cuBLAS `add_rms_norm`).
T in {1, 4, 16}: the decode buckets the threshold `gemv_max_tokens` would cover.
Each step is timed inside a CUDA graph of REPS passes, so the GPU is measured, not the launch path.
extra_info: `us_per_layer` (test_down_proj: `us_per_call`; the median), `gb_per_s` (the weights'
bytes over that time), `frac_of_copy` (over a device-to-device copy's rate measured in the same
session) and `kernels_per_layer` (`kernels_per_call`: GPU kernels of one eager pass under
torch.profiler, over the layers).
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from rl_shapes import QWEN25_05B as C
from test_bench_paged_attention import copy_gb_per_s, graph_of  # noqa: F401 (copy_gb_per_s: a fixture)

from oreal_fast.kernels.decode_gemv import add_rms_norm_partials, linear_partials
from oreal_fast.kernels.trunk_inference import add_rms_norm, rope_write_kv
from oreal_fast.rollout.engine.inference_model import InferenceModel

TOKENS = (1, 4, 16)
REPS = 4
DOWN_SPLITS = (512, 1024, 2048, 8192)  # 8192 >= K: one split, no partial sum to add


@pytest.fixture(scope="module")
def model() -> InferenceModel:
    """The engine's weight copy at the 0.5B shape, random: matrices N(0, 0.02), norms 1 + N(0, 0.1),
    biases N(0, 0.1)."""
    m = InferenceModel(C, device="cuda", dtype=torch.bfloat16, impl="triton")
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, device="cuda", generator=g) * 0.02)
            else:
                base = 1.0 if name.endswith("norm") else 0.0
                p.copy_(base + torch.randn(p.shape, device="cuda", generator=g) * 0.1)
    return m


class RopeWriteOnly:
    """Stand-in `PagedCache` of T tokens: rope and the K/V write into a one-block pool (token t at
    slot t; every layer writes the same pool), the roped queries as the attention output."""

    def __init__(self, T: int) -> None:
        self.k, self.v = torch.zeros(2, 1, T, C.num_kv_heads, C.head_dim, dtype=torch.bfloat16, device="cuda")
        self.slots = torch.arange(T, device="cuda")

    def kv_pool(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.k, self.v, self.slots

    def attend(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return rope_write_kv(qkv, positions, rope, self.k, self.v, self.slots)

    def attend_roped(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return q


def layer_weight_bytes(model: InferenceModel) -> int:
    """Bytes of one layer's weights (matrices, biases, norms): what a layer reads at least."""
    return sum(p.numel() * p.element_size() for p in model.layers[0].parameters())


def kernels_of(fn) -> int:
    """GPU kernels and copies one eager call of fn launches (after a warm call)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())


def time_graph(benchmark, graph: torch.cuda.CUDAGraph) -> float:
    """Median seconds of one graph replay (20 rounds after 2 warm-ups)."""
    def step():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=20, warmup_rounds=2, iterations=1)
    return benchmark.stats.stats.median


def free_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("provider", ["plain", "gemv"])
@pytest.mark.parametrize("T", TOKENS)
def test_trunk(benchmark, model, copy_gb_per_s, T, provider):
    free_memory()
    g = torch.Generator(device="cuda").manual_seed(T)
    x0 = torch.randn(T, C.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    positions, rope, cache = torch.zeros(T, dtype=torch.int64, device="cuda"), model.rope_table(), RopeWriteOnly(T)

    def trunk():
        x, residual = x0, None
        for layer in model.layers:
            forward = layer.forward_gemv if provider == "gemv" else layer
            x, residual = forward(x, residual, positions, rope, cache)
        return x, residual

    kernels = kernels_of(trunk)
    graph = graph_of(trunk, REPS)
    seconds = time_graph(benchmark, graph) / (REPS * C.num_layers)
    gb_per_s = layer_weight_bytes(model) / seconds / 1e9
    benchmark.extra_info.update(T=T, provider=provider, us_per_layer=seconds * 1e6, gb_per_s=gb_per_s,
                                frac_of_copy=gb_per_s / copy_gb_per_s, kernels_per_layer=kernels / C.num_layers)
    graph.reset()


@pytest.mark.parametrize("split", ["cublas", *DOWN_SPLITS])
@pytest.mark.parametrize("T", TOKENS)
def test_down_proj(benchmark, model, copy_gb_per_s, T, split):
    free_memory()
    g = torch.Generator(device="cuda").manual_seed(T)
    act = torch.randn(T, C.intermediate_size, device="cuda", generator=g).to(torch.bfloat16)
    residual = torch.randn(T, C.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    norm = model.norm

    def calls():
        for layer in model.layers:
            w = layer.mlp.down.weight
            if split == "cublas":
                add_rms_norm(F.linear(act, w), residual, norm, C.rms_norm_eps)
            else:
                add_rms_norm_partials(linear_partials(act, w, split=split), residual, norm, C.rms_norm_eps)

    kernels = kernels_of(calls)
    graph = graph_of(calls, REPS)
    seconds = time_graph(benchmark, graph) / (REPS * C.num_layers)
    gb_per_s = model.layers[0].mlp.down.weight.numel() * 2 / seconds / 1e9
    benchmark.extra_info.update(T=T, split=str(split), us_per_call=seconds * 1e6, gb_per_s=gb_per_s,
                                frac_of_copy=gb_per_s / copy_gb_per_s, kernels_per_call=kernels / C.num_layers)
    graph.reset()
