"""The pure decode step of the paged engine against its memory floor (Qwen2.5-0.5B shape, random
init, bf16, CUDA graphs on).

Run: `pytest benchmarks/test_bench_decode.py --benchmark-only` (CUDA only).
Cases `B{batch}-C{context}`: 1@128, 16@128, 64@128, 256@128, 256@2048 and 64@8192 at the engine's
default `decode_steps_per_round`; `-D{d}` cases at 1@128 and 256@128 with d = 1, 4, 32; `-G16` cases
at 1, 4 and 16 @128 with the few-token GEMV layers on (`gemv_max_tokens` 16); `-noP` cases at 1@128
(the default GEMV threshold) and 4@128 (`-G16`) with those layers' kernels launched plainly, not with
programmatic dependent launch (`gemv_pdl`, the default on Hopper and later); `-noO` cases at 1, 16 and
256 @128 with each decode round read before the next is planned (`overlap_rounds` off; the default
launches the next round first); `-K0` cases at 4 and 16 @128 and 16 @2048 with the skinny-GEMM
layers off (`skinny_max_tokens` 0: cuBLAS's layers at those rows), beside the default cases 4 @128
and 16 @2048 (16 @128 is the grid's); a `-K64` case at 64 @128 with them on up to 64 rows. A case
that sets an
`EngineConfig` key runs only where the engine has that key, so the file also runs against engines
from before it. Each of
the `batch` rows has its own random prompt of `context` tokens (no shared prefix: every step reads
every row's KV), top-p 0.9, no stop token. Only the public engine API is used.

The prefill is excluded by a difference: one call makes N = 32 decode steps (max_new_per_prompt =
N + 1, the first token comes from the prefill), the other N + E = 96; step_ms = (fastest N + E call -
fastest N call) / E over 7 rounds each, every call synchronised by its result. The fastest, not the
median: host jitter (a collection, the allocator, another process) only ever adds time, and with 3
rounds and medians the estimate at batch 256 ranged over 1.3-3.3 ms on one H100 for one code.
N and N + E are multiples of every round length measured, so both calls run whole rounds and the
rounds' host work is counted in its share.

extra_info per case:
  batch, context
  engine_overrides  the EngineConfig keys the case sets besides the defaults (the pool, max_num_seqs
                 and max_model_len are sized per case)
  engine_config  every field of the EngineConfig the case ran with
  step_ms        wall time of one decode step, as above
  floor_ms       (bf16 weights + the KV the step reads, batch x (context + N + E / 2) x 12 KiB) over copy_gbps
  copy_gbps      device-to-device copy of 1 GiB, (read + write bytes) / time, measured in this run
  gpu_ms         GPU time of one step's CUDA-graph replays (CUDA events around every replay, the same
                 difference of two calls): all of the step where sampling and the stop check are
                 captured too; engines that run them outside the graph leave them out of it
  wall_over_gpu  step_ms / gpu_ms: 1.0 when the host never keeps the GPU waiting
  kernels_per_step  GPU kernels and copies per decode step of the same engine without CUDA graphs
                 (torch.profiler, calls of 8 and 16 decode steps, difference over 8, the rounds'
                 own kernels counted in their share)
  oreal_fast_path  the file of the oreal_fast this run imported (which tree a baseline run measured)
  engine_*       the engine's stats() after the N + E call
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from gpu_timing import copy_gb_per_s

import oreal_fast
from oreal_fast.model.decoder import Decoder, DecoderConfig
from oreal_fast.rollout import EngineConfig, PagedEngine, SamplingParams

QWEN25_05B = DecoderConfig(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                           tie_embeddings=True, qkv_bias=True)
KV_BYTES_PER_TOKEN = 24 * 2 * 2 * 64 * 2  # layers x (k, v) x KV heads x head dim x bf16
N, E = 32, 64  # decode steps of the short call, extra steps of the long one
PROFILE_STEPS = (8, 16)
ROUNDS = 7
GRID = [(1, 128), (16, 128), (64, 128), (256, 128), (256, 2048), (64, 8192)]


def case(batch: int, context: int, suffix: str = "", **engine):
    """One case: `batch` rows of `context` tokens, `engine` the EngineConfig keys it sets; its id is
    B{batch}-C{context}{suffix}."""
    return pytest.param(batch, context, engine, id=f"B{batch}-C{context}{suffix}")


CASES = ([case(b, c) for b, c in GRID]
         + [case(b, 128, f"-D{d}", decode_steps_per_round=d) for b in (1, 256) for d in (1, 4, 32)]
         + [case(b, 128, "-G16", gemv_max_tokens=16) for b in (1, 4, 16)]
         + [case(1, 128, "-noP", gemv_pdl=False), case(4, 128, "-G16-noP", gemv_max_tokens=16, gemv_pdl=False)]
         + [case(b, 128, "-noO", overlap_rounds=False) for b in (1, 16, 256)]
         + [case(b, c, "-K0", skinny_max_tokens=0) for b, c in ((4, 128), (16, 128), (16, 2048))]
         + [case(64, 128, "-K64", skinny_max_tokens=64)]
         + [case(b, c) for b, c in ((4, 128), (16, 2048))])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Decoder(QWEN25_05B, device="cuda", dtype=torch.bfloat16)
    m.init_weights()
    return m.requires_grad_(False).eval()


@pytest.fixture(scope="module")
def copy_gbps() -> float:
    return copy_gb_per_s()


def make_engine(model, batch: int, context: int, engine: dict, cuda_graph: bool) -> PagedEngine:
    """The case's engine: block tables spanning the case's tokens (unless `engine` sets max_model_len)
    and a pool that holds every row at once (no preemption) and one max_model_len sequence."""
    sized = {"max_model_len": context + N + E + 1, "max_num_seqs": batch, "cuda_graph": cuda_graph} | engine
    tokens = max((batch + 1) * (context + N + E + 1), sized["max_model_len"])
    pool = int(1.05 * (-(-tokens // 16) + batch + 1) * 16 * KV_BYTES_PER_TOKEN)  # + a partial block per row
    return PagedEngine(model, EngineConfig(kv_cache_bytes=pool, **sized), dtype=torch.bfloat16)


def decode_call(engine: PagedEngine, prompts: list[list[int]], steps: int):
    """A generate call making `steps` decode steps; returns the function running it (synchronised by its result)."""
    context = len(prompts[0])
    params = SamplingParams(max_new_tokens=N + E + 1, max_length=context + N + E + 1, top_p=0.9)
    caps = [steps + 1] * len(prompts)
    return lambda: engine.generate(prompts, params, torch.Generator("cuda").manual_seed(0), max_new_per_prompt=caps)


@contextlib.contextmanager
def replay_times():
    """Milliseconds of GPU time of every CUDA-graph replay inside the block (CUDA events around each)."""
    pairs = []
    replay = torch.cuda.CUDAGraph.replay

    def timed(graph):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay(graph)
        end.record()
        pairs.append((start, end))

    times: list[float] = []
    torch.cuda.CUDAGraph.replay = timed
    try:
        yield times
    finally:
        torch.cuda.CUDAGraph.replay = replay
        torch.cuda.synchronize()
        times += [s.elapsed_time(e) for s, e in pairs]


def time_step(benchmark, engine: PagedEngine, prompts: list[list[int]]) -> float:
    """Milliseconds of one decode step: (fastest N + E call - fastest N call) / E, the calls interleaved."""
    short, long = decode_call(engine, prompts, N), decode_call(engine, prompts, N + E)
    long()  # warm-up: kernels compile and every graph the case replays is captured
    short_times: list[float] = []

    def time_short():
        t0 = time.perf_counter()
        short()
        short_times.append(time.perf_counter() - t0)

    benchmark.pedantic(long, setup=time_short, rounds=ROUNDS, iterations=1)
    return (benchmark.stats.stats.min - min(short_times)) / E * 1e3


def graph_ms_per_step(engine: PagedEngine, prompts: list[list[int]]) -> float:
    totals = []
    for steps in (N, N + E):
        with replay_times() as times:
            decode_call(engine, prompts, steps)()
        totals.append(sum(times))
    return (totals[1] - totals[0]) / E


def kernels_per_step(engine: PagedEngine, prompts: list[list[int]]) -> float:
    """Run after a graph engine of the same case: every kernel is compiled, so each call launches only its own."""
    counts = []
    for steps in PROFILE_STEPS:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            decode_call(engine, prompts, steps)()
            torch.cuda.synchronize()
        counts.append(sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events()))
    return (counts[1] - counts[0]) / (PROFILE_STEPS[1] - PROFILE_STEPS[0])


def free_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("batch, context, engine", CASES)
def test_decode_step(benchmark, model, copy_gbps, batch, context, engine):
    missing = sorted(set(engine) - set(EngineConfig.__dataclass_fields__))
    if missing:
        pytest.skip(f"this engine has no {', '.join(missing)}")
    if "gemv_pdl" in engine and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("this GPU has no programmatic dependent launch")
    g = torch.Generator().manual_seed(batch * 100003 + context)
    prompts = torch.randint(0, 151000, (batch, context), generator=g).tolist()
    free_memory()
    paged = make_engine(model, batch, context, engine, cuda_graph=True)
    step_ms = time_step(benchmark, paged, prompts)
    gpu_ms = graph_ms_per_step(paged, prompts)
    stats, config = paged.stats(), dataclasses.asdict(paged.config)
    del paged
    free_memory()
    kernels = kernels_per_step(make_engine(model, batch, context, engine, cuda_graph=False), prompts)
    free_memory()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = batch * (context + N + E // 2) * KV_BYTES_PER_TOKEN
    floor_ms = (weight_bytes + kv_bytes) / (copy_gbps * 1e9) * 1e3
    benchmark.extra_info.update(
        batch=batch, context=context, engine_overrides=engine, engine_config=config,
        step_ms=step_ms,
        floor_ms=floor_ms,
        copy_gbps=copy_gbps, gpu_ms=gpu_ms, wall_over_gpu=step_ms / gpu_ms, kernels_per_step=kernels,
        oreal_fast_path=oreal_fast.__file__, **{f"engine_{k}": v for k, v in stats.items()})
