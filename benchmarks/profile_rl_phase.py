"""Where one micro-batch's RL phase spends its GPU time, by kind of kernel (the `merged` provider of
test_bench_rl_phase.py: the trainer's defaults and its recompute plan under 40 GiB).

  python benchmarks/profile_rl_phase.py --out rl_phase_profile.json [--lengths 4096 16384]

For each length L (2 sequences of L tokens, 512 prompt tokens each), after one warm-up step,
torch.profiler (CUDA activity) over one step. Kernels are grouped by name:
  attention_fwd / attention_bwd   the flash varlen kernels (forward, and the backward's dq / dk dv
                                  and its pre- and post-processing)
  gemm                            cuBLAS / CUTLASS matmuls (nvjet, sm90 xmma, cutlass, gemv)
  triton                          our Triton kernels (LM head + log-prob, trunk ops), by kernel name
  elementwise                     torch's elementwise, reduction and copy kernels
  memcpy / memset                 copies and fills
and per group: GPU ms, share of the busy time, calls. Attention's achieved rate uses the causal
FLOPs of one layer's call, 4 x head_dim x heads x sum n (n + 1) / 2 forward and 2.5 x that backward
(rl_shapes.py), times the layer calls (forward: reference, RM, actor and the recomputed blocks;
backward: RM and actor), over the group's time: how near the flash kernels run to the GEMM peak.
"""

from __future__ import annotations

import argparse
import json
import re
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rl_shapes import PEAK_FLOPS, QWEN25_05B, micro_batch_step, micro_batch_trajectories

GROUPS = (  # first match wins
    ("attention_bwd", re.compile(r"flash.*bwd|bwd.*flash|flash_bwd|dot_do_o|convert_dq", re.I)),
    ("attention_fwd", re.compile(r"flash.*fwd|fwd.*flash|flash_fwd", re.I)),
    ("gemm", re.compile(r"nvjet|xmma|cutlass|gemm|gemv|cublas|sm90_", re.I)),
    ("memcpy", re.compile(r"memcpy", re.I)),
    ("memset", re.compile(r"memset", re.I)),
    ("elementwise", re.compile(r"elementwise|reduce_kernel|at::native|CatArray|index|scatter|gather", re.I)),
)


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "triton" if name.startswith("_") else "other"


def profile_length(length: int) -> dict:
    step, recomputed = micro_batch_step(length)
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    groups: dict[str, dict] = {}
    by_name: dict[str, float] = {}
    for k in kernels:
        ms = k.device_time / 1e3
        g = groups.setdefault(group_of(k.name), {"ms": 0.0, "calls": 0})
        g["ms"] += ms
        g["calls"] += 1
        by_name[k.name] = by_name.get(k.name, 0.0) + ms
    total = sum(g["ms"] for g in groups.values())
    for g in groups.values():
        g["share"] = g["ms"] / total
    c = QWEN25_05B
    lens = [t.num_tokens for t in micro_batch_trajectories(length)]
    layer_fwd = 4 * c.head_dim * c.num_heads * sum(n * (n + 1) // 2 for n in lens)
    # layer calls: forward in the reference, RM and actor and again in each recomputed block of the
    # two trained models; backward in the two trained models
    passes = {"attention_fwd": (3 * c.num_layers + 2 * recomputed, layer_fwd),
              "attention_bwd": (2 * c.num_layers, 2.5 * layer_fwd)}
    rates = {name: {"layer_calls": n, "kernel_calls": groups[name]["calls"],
                    "tflops": n * flops / (groups[name]["ms"] / 1e3) / 1e12}
             for name, (n, flops) in passes.items() if name in groups}
    return {"length": length, "tokens": sum(lens), "recomputed_blocks": recomputed, "wall_ms": wall_ms,
            "gpu_kernel_ms": total, "groups": groups, "attention_rates": rates, "peak_tflops": PEAK_FLOPS / 1e12,
            "top_kernels_ms": sorted(by_name.items(), key=lambda kv: -kv[1])[:20]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 16384])
    args = parser.parse_args()
    results = []
    for length in args.lengths:
        r = profile_length(length)
        results.append(r)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"2 x {length}: wall {r['wall_ms']:.1f} ms, kernels {r['gpu_kernel_ms']:.1f} ms, "
              f"recomputed blocks {r['recomputed_blocks']}", flush=True)
        for name, g in sorted(r["groups"].items(), key=lambda kv: -kv[1]["ms"]):
            print(f"  {name:>14}: {g['ms']:8.1f} ms {100 * g['share']:5.1f} %  calls {g['calls']}", flush=True)
        for name, rate in r["attention_rates"].items():
            print(f"  {name} rate: {rate}", flush=True)
        for name, ms in r["top_kernels_ms"][:10]:
            print(f"    {ms:8.1f} ms  {name[:110]}", flush=True)


if __name__ == "__main__":
    main()
