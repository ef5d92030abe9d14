"""Latency of the sampler's four kernels, this tree's beside another version's, in one run.

    python benchmarks/sweep_sampling.py [--root DIR] [--chunk N ...] [--sweep-warps N ...]
        [--plan-warps N ...] [--draw-warps N ...] [--draw-pivots N ...] [--batches B ...] [--vocab V]

For B in --batches (default 1, 16, 256) and bf16 logits [B, V = 151936] drawn N(0, s^2), s in
(0.6, 3.0), top-p 0.9 (and top-k 20 with top-p 0.9 at the largest B), each version of `oreal_fast/kernels/sampling.py` gets:
the whole `sample_with_logprobs` call captured in a CUDA graph (median of 100 replays, CUDA
events), each kernel's GPU time per call (torch.profiler: `_stats_kernel`, `_plan_kernel`,
`_compact_kernel`, `_draw_kernel`), the fraction of rows the two sweeps resolved (the rest took the
search fallback) and the rows whose token differs from the eager twin's (fp32 round-off allows a
few in 256).

--root DIR: a folder holding another version's `oreal_fast/` (`git archive COMMIT oreal_fast | tar
-x -C DIR`), loaded by path beside this tree's (the kernel file imports only torch and triton);
without it only this tree runs. --chunk / --sweep-warps / --plan-warps / --draw-warps /
--draw-pivots: values for those fields of this tree's `_Config` (each combination is one more
variant; chunk a power of two). --vocab and --batches: small shapes, for a
run on CPU under TRITON_INTERPRET=1 (wall-clock times, no kernel split). Prints a table; writes
$OUT/sweep_sampling.json (OUT defaults to the current folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import itertools
import json
import os
import statistics
import sys
import time
from types import ModuleType

import torch

KERNELS = ("_stats_kernel", "_plan_kernel", "_compact_kernel", "_draw_kernel")
SPREADS = (0.6, 3.0)
REPLAYS = 100
# the `_Config` fields a run may override, and their short names in the table
OVERRIDES = {"chunk": "ch", "sweep_warps": "sw", "plan_warps": "pw", "draw_warps": "dw", "draw_pivots": "dp"}


def load_module(root: str | None) -> ModuleType:
    """This tree's sampling module, or the one under root (a folder holding oreal_fast/)."""
    if root is None:
        return importlib.import_module("oreal_fast.kernels.sampling")
    path = os.path.join(root, "oreal_fast", "kernels", "sampling.py")
    if not os.path.exists(path):
        sys.exit(f"--root {root}: no oreal_fast/kernels/sampling.py there")
    name = "baseline_kernels_sampling"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def variants(args: argparse.Namespace) -> list[tuple[str, ModuleType, dict]]:
    """(label, module, config changes): the baseline as it is, then this tree per override combination."""
    out = [("base", load_module(args.root), {})] if args.root else []
    this = load_module(None)
    given = [(field, getattr(args, field)) for field in OVERRIDES if getattr(args, field)]
    for combo in itertools.product(*(values for _, values in given)):
        change = {field: v for (field, _), v in zip(given, combo)}
        label = "this" + "".join(f" {OVERRIDES[f]}{v}" for f, v in change.items())
        out.append((label, this, change))
    return out


def seconds_per_call(fn, device: torch.device) -> float:
    """Median seconds of one call: CUDA-graph replays timed by events on CUDA, wall clock on CPU."""
    fn()
    if device.type != "cuda":
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    graph.reset()
    return statistics.median(times)


def kernel_us(fn, device: torch.device, calls: int = 20) -> dict[str, float]:
    """GPU microseconds per call of each sampler kernel (torch.profiler; empty on CPU)."""
    if device.type != "cuda":
        return {}
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / calls for e in prof.key_averages() if e.key in KERNELS}


def run_case(mod: ModuleType, change: dict, x: torch.Tensor, u: torch.Tensor, top_k: int, top_p: float,
             ref: torch.Tensor) -> dict:
    cfg = dataclasses.replace(mod._config(x.device, x.shape[1]), **change)
    fn = lambda: mod._sample(x, u, 1.0, top_k, top_p, cfg, logprobs=True)  # noqa: E731
    if not change:  # the module's own config: the public call itself
        fn = lambda: mod.sample_with_logprobs(x, u, top_k=top_k, top_p=top_p)  # noqa: E731
    tokens, resolved, _ = mod._sample(x, u, 1.0, top_k, top_p, cfg, logprobs=True)
    return dict(us=seconds_per_call(fn, x.device) * 1e6, kernels_us=kernel_us(fn, x.device),
                resolved=float(resolved.float().mean()), differ_from_eager=int((tokens != ref).sum()))


def print_table(rows: list[dict]) -> None:
    print(f"\n{'B':>4} {'s':>4} {'k':>3} {'p':>4}  {'version':18s} {'graph us':>9} "
          + " ".join(f"{k.strip('_').removesuffix('_kernel'):>8}" for k in KERNELS) + "  resolved  differ")
    for r in rows:
        ks = " ".join(f"{r['kernels_us'].get(k, float('nan')):8.1f}" for k in KERNELS)
        print(f"{r['B']:4d} {r['spread']:4.1f} {r['top_k']:3d} {r['top_p']:4.2f}  {r['version']:18s} "
              f"{r['us']:9.1f} {ks}  {r['resolved']:8.3f}  {r['differ_from_eager']:6d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", help="a folder holding another version's oreal_fast/ (the baseline)")
    for field in OVERRIDES:
        ap.add_argument("--" + field.replace("_", "-"), type=int, nargs="*", default=[])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--vocab", type=int, default=151936)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    versions = variants(args)
    res = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "vocab": args.vocab, "root": args.root, "rows": []}
    cases = ([(B, s, 0, 0.9) for B in args.batches for s in SPREADS]
             + [(max(args.batches), 3.0, 20, 0.9)])  # (B, spread, top_k, top_p)
    for B, spread, top_k, top_p in cases:
        g = torch.Generator(device=device).manual_seed(B)
        x = (torch.randn(B, args.vocab, device=device, generator=g) * spread).bfloat16()
        u = torch.rand(B, device=device, generator=g)
        ref = versions[0][1].sample_from_logits_eager(x, u, top_k=top_k, top_p=top_p)
        for label, mod, change in versions:
            row = dict(B=B, spread=spread, top_k=top_k, top_p=top_p, version=label, config=change)
            row.update(run_case(mod, change, x, u, top_k, top_p, ref))
            res["rows"].append(row)
        del x
    res["seconds"] = time.time() - t0
    out = os.path.join(os.environ.get("OUT", "."), "sweep_sampling.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    timing = f"CUDA graph, median of {REPLAYS}" if device.type == "cuda" else "wall clock"
    print(f"{res['device']}, V = {args.vocab}: whole sample_with_logprobs ({timing}) and each kernel's "
          f"GPU time, us; {res['seconds']:.0f} s")
    print_table(res["rows"])
    print(f"-> {out}")


if __name__ == "__main__":
    main()
