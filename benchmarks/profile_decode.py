"""Where a decode step of the paged engine spends its GPU time (Qwen2.5-0.5B shape, random init, bf16).

  python benchmarks/profile_decode.py --out decode_profile.json [--batch 256]

B prompts of 128 random tokens, 64 new tokens, top-p 0.9. The step is profiled eagerly (no CUDA
graph, so each kernel shows; the graph replays the same kernels): per decode step, the GPU time of
each kernel family (by name) and the number of kernels. The graph's wall time per step is measured
too, from a second engine with CUDA graphs.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from oreal_fast.model.decoder import Decoder, DecoderConfig
from oreal_fast.rollout import EngineConfig, PagedEngine, SamplingParams

QWEN25_05B = DecoderConfig(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                           tie_embeddings=True, qkv_bias=True)
PROMPT, NEW = 128, 64


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Decoder(QWEN25_05B, device="cuda", dtype=torch.bfloat16)
    model.init_weights()
    prompts = torch.randint(0, 151000, (args.batch, PROMPT)).tolist()
    params = SamplingParams(max_new_tokens=NEW, max_length=PROMPT + NEW, top_p=0.9)
    result = {"batch": args.batch}
    for graphs in (True, False):
        engine = PagedEngine(model, EngineConfig(max_model_len=PROMPT + NEW, kv_cache_bytes=2**30,
                                                 max_num_seqs=args.batch, cuda_graph=graphs), dtype=torch.bfloat16)
        engine.generate(prompts, params, torch.Generator("cuda").manual_seed(0))  # warm-up: compile, capture
        torch.cuda.synchronize()
        if graphs:
            t0 = time.perf_counter()
            engine.generate(prompts, params, torch.Generator("cuda").manual_seed(1))
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            result["graph_tokens_per_s"] = args.batch * NEW / seconds
            result["graph_call_s"] = seconds
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.generate(prompts, params, torch.Generator("cuda").manual_seed(1))
            torch.cuda.synchronize()
        steps = engine.stats()["decode_steps"]
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name: dict[str, list[float]] = {}
        for k in kernels:
            entry = by_name.setdefault(k.name[:90], [0.0, 0])
            entry[0] += k.device_time / 1e3 / steps  # ms per decode step (the prefill is spread in too)
            entry[1] += 1 / steps
        top = sorted(by_name.items(), key=lambda kv: -kv[1][0])
        result.update(decode_steps=steps, kernels_per_step=len(kernels) / steps,
                      gpu_ms_per_step=sum(v[0] for _, v in top),
                      top_kernels=[{"name": n, "ms_per_step": v[0], "calls_per_step": v[1]} for n, v in top[:25]])
        del engine
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"batch {args.batch}: graph {result['graph_tokens_per_s']:.0f} tok/s; eager profile "
          f"{result['gpu_ms_per_step']:.2f} GPU ms/step, {result['kernels_per_step']:.0f} kernels/step")
    for k in result["top_kernels"][:15]:
        print(f"  {k['ms_per_step']:7.3f} ms  {k['calls_per_step']:6.1f}x  {k['name']}")


if __name__ == "__main__":
    main()
