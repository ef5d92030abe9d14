"""Kernels and time of one decode step of the paged engine (Qwen2.5-0.5B shape, random init, bf16).

  python benchmarks/profile_decode.py --out decode_profile.json [--batches 1 16 64 256] [--tiny]

Per batch B: B prompts of 128 random tokens, top-p 0.9, no stop token, so every sequence decodes
every step. A decode step is isolated by difference, prefill excluded: the same prompts generate
NEW_SHORT and then NEW_SHORT + EXTRA new tokens, and step figures are (second - first) / (the
decode steps between them), the sampler and the host's per-step work included.

- kernels: an eager engine (no CUDA graph, so each kernel shows; a graph replays the same kernels
  at the same shapes) under the profiler, grouped by kernel name: launches and GPU time per step.
  Per layer: a name launched c times a step counts c // num_layers per layer, the remainder
  outside the layers (embedding, final norm, LM head, sampler, row-state arithmetic).
- wall: an engine with CUDA graphs, median of REPEATS calls each, wall milliseconds per step:
  the graph replay plus the host between replays.

`--tiny` runs a 2-layer, 64-wide config on the CPU (eager, no graphs; CPU ops stand in for
kernels) to check the script where no GPU is. JSON: per batch the step figures and the launches
per name; the table printed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from oreal_fast.model.decoder import Decoder, DecoderConfig
from oreal_fast.rollout import EngineConfig, PagedEngine, SamplingParams

QWEN25_05B = DecoderConfig(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                           tie_embeddings=True, qkv_bias=True)
TINY = DecoderConfig(family="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6, tie_embeddings=True, qkv_bias=True)
CONTEXT, NEW_SHORT, EXTRA, REPEATS = 128, 4, 32, 3


def make_engine(model: Decoder, batch: int, graphs: bool) -> PagedEngine:
    config = EngineConfig(max_model_len=CONTEXT + NEW_SHORT + EXTRA, kv_cache_bytes=2**30, max_num_seqs=batch,
                          max_prefill_batch=batch, cuda_graph=graphs)
    return PagedEngine(model, config, dtype=model.embed.weight.dtype)


def generate(engine: PagedEngine, prompts: list[list[int]], new: int) -> int:
    """One call of `new` tokens per prompt; returns its decode steps."""
    params = SamplingParams(max_new_tokens=new, max_length=CONTEXT + new, top_p=0.9)
    engine.generate(prompts, params, torch.Generator(engine.device).manual_seed(new))
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return engine.stats()["decode_steps"]


def kernel_events(prof: profile, device: torch.device) -> list[tuple[str, float]]:
    """(name, microseconds) of every GPU kernel (memcpy and memset included), or on CPU of every leaf op."""
    if device.type == "cuda":
        return [(e.name, e.device_time) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name, e.self_cpu_time_total) for e in prof.events() if not e.cpu_children]


def profile_calls(model: Decoder, prompts: list[list[int]], batch: int) -> tuple[int, dict[str, list[float]]]:
    """Eager engine: decode steps between the two calls, and per kernel name [launches, us] between them."""
    engine = make_engine(model, batch, graphs=False)
    generate(engine, prompts, NEW_SHORT + EXTRA)  # warm-up: Triton compiles, cuBLAS picks its kernels
    device = engine.device
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    counts, steps = [], []
    for new in (NEW_SHORT, NEW_SHORT + EXTRA):
        with profile(activities=[activity]) as prof:
            steps.append(generate(engine, prompts, new))
        by_name: dict[str, list[float]] = {}
        for name, us in kernel_events(prof, device):
            entry = by_name.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += us
        counts.append(by_name)
    short, long = counts
    diff = {n: [v[0] - short.get(n, [0, 0.0])[0], v[1] - short.get(n, [0, 0.0])[1]] for n, v in long.items()}
    return steps[1] - steps[0], {n: v for n, v in diff.items() if v[0] > 0}


def wall_per_step(model: Decoder, prompts: list[list[int]], batch: int) -> float:
    """Milliseconds of wall time per decode step with CUDA graphs (eager on CPU)."""
    engine = make_engine(model, batch, graphs=True)
    generate(engine, prompts, NEW_SHORT + EXTRA)  # warm-up
    seconds, steps = {}, {}
    for new in (NEW_SHORT, NEW_SHORT + EXTRA):
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            steps[new] = generate(engine, prompts, new)
            times.append(time.perf_counter() - t0)
        seconds[new] = statistics.median(times)
    return 1e3 * (seconds[NEW_SHORT + EXTRA] - seconds[NEW_SHORT]) / (steps[NEW_SHORT + EXTRA] - steps[NEW_SHORT])


def measure(model: Decoder, batch: int) -> dict:
    """Step figures of one batch size (see the module docstring)."""
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, model.config.vocab_size, (batch, CONTEXT), generator=g).tolist()
    steps, by_name = profile_calls(model, prompts, batch)
    L = model.config.num_layers
    kernels = [{"name": n, "per_step": c / steps, "per_layer": round(c / steps) // L, "us_per_step": us / steps}
               for n, (c, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])]
    per_step = sum(k["per_step"] for k in kernels)
    per_layer = sum(k["per_layer"] for k in kernels)
    result = {"batch": batch, "context": CONTEXT, "decode_steps_profiled": steps, "kernels_per_step": per_step,
              "kernels_per_layer": per_layer, "kernels_outside_layers": per_step - per_layer * L,
              "gpu_ms_per_step": sum(k["us_per_step"] for k in kernels) / 1e3,
              "cuda_graph": model.embed.weight.is_cuda, "wall_ms_per_step": wall_per_step(model, prompts, batch),
              "kernels": kernels}
    if model.embed.weight.is_cuda:
        torch.cuda.empty_cache()
    return result


def print_table(results: list[dict], num_layers: int) -> None:
    print(f"{'batch':>5} {'kernels/step':>12} {'/layer':>6} {'outside':>7} {'GPU ms/step':>11} {'wall ms/step':>12}")
    for r in results:
        print(f"{r['batch']:>5} {r['kernels_per_step']:>12.1f} {r['kernels_per_layer']:>6} "
              f"{r['kernels_outside_layers']:>7.1f} {r['gpu_ms_per_step']:>11.3f} {r['wall_ms_per_step']:>12.3f}")
    last = results[-1]
    print(f"per layer at batch {last['batch']} ({num_layers} layers), then outside the layers per step:")
    for k in last["kernels"]:
        if k["per_layer"]:
            print(f"  {k['per_layer']:3d} x  {k['us_per_step'] / num_layers:7.2f} us/layer  {k['name'][:90]}")
    for k in last["kernels"]:
        rest = k["per_step"] - k["per_layer"] * num_layers
        if rest > 0:
            print(f"  {rest:5.1f} x/step  {k['name'][:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer config on the CPU (checks the script)")
    args = parser.parse_args()
    config, device, dtype = (TINY, "cpu", torch.float32) if args.tiny else (QWEN25_05B, "cuda", torch.bfloat16)
    torch.manual_seed(0)
    model = Decoder(config, device=device, dtype=dtype)
    model.init_weights()
    model.requires_grad_(False)
    results = [measure(model, b) for b in args.batches]
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "torch": torch.__version__, "results": results}, f, indent=1)
    print_table(results, config.num_layers)


if __name__ == "__main__":
    main()
