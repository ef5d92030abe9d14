"""Latency of the sampler's four kernels, this tree's beside other versions', in one run.

    python benchmarks/sweep_sampling.py [--root DIR ...] [--chunk N ...] [--sweep-warps N ...]
        [--plan-warps N ...] [--draw-warps N ...] [--draw-pivots N ...] [--batches B ...] [--vocab V]

For B in --batches (default 1, 16, 256) and bf16 logits [B, V = 151936] drawn N(0, s^2), s in
(0.6, 3.0), top-p 0.9 (and top-k 20 with top-p 0.9 at the largest B), each version of
`oreal_fast/kernels/sampling.py` gets: the whole `sample_with_logprobs` call captured in a CUDA
graph (median of 100 replays, CUDA events), each kernel's GPU time per call (torch.profiler: `_stats_kernel`, `_plan_kernel`,
`_compact_kernel`, `_draw_kernel`), the fraction of rows the two sweeps resolved (the rest took the
search fallback) and the rows whose token differs from the eager twin's (fp32 round-off allows a
few in 256). Then, for this tree's config at the largest B, the share of rows resolved without the
fallback over normal and Zipf-like rows and four (temperature, top-k, top-p) settings.

--root DIR ...: folders each holding another version's `oreal_fast/` (`git archive COMMIT oreal_fast |
tar -x -C DIR`), loaded by path beside this tree's (the kernel file imports only torch and triton)
and labelled by the folder's name; without it only this tree runs. --chunk / --sweep-warps /
--plan-warps / --draw-warps / --draw-pivots: values for those fields of this tree's `_Config` (each
combination is one more variant; chunk a power of two). --vocab and --batches: small shapes, for a
run on CPU under TRITON_INTERPRET=1 (wall-clock times, no kernel split). Prints a table; writes
$OUT/sweep_sampling.json (OUT defaults to the current folder), rewritten after each case so that a
time limit keeps what ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import os
import statistics
import sys
import time
from types import ModuleType

import torch

from baseline import load_version_module
from gpu_timing import graph_seconds

KERNELS = ("_stats_kernel", "_plan_kernel", "_compact_kernel", "_draw_kernel")
SPREADS = (0.6, 3.0)
REPLAYS = 100
# row kinds (kind, spread) and (temperature, top_k, top_p) settings of the resolved-share table
COVERAGE_ROWS = (("normal", 0.3), ("normal", 0.6), ("normal", 1.0), ("normal", 3.0), ("zipf", 0.7), ("zipf", 1.0),
                 ("zipf", 2.0))
COVERAGE_SETTINGS = ((1.0, 0, 0.9), (0.7, 20, 0.9), (1.0, 0, 0.5), (1.3, 0, 0.95))
# the `_Config` fields a run may override, and their short names in the table
OVERRIDES = {"chunk": "ch", "sweep_warps": "sw", "plan_warps": "pw", "draw_warps": "dw", "draw_pivots": "dp"}


def load_module(root: str | None) -> ModuleType:
    """This tree's sampling module, or the one under root (a folder holding oreal_fast/)."""
    if root is None:
        return importlib.import_module("oreal_fast.kernels.sampling")
    try:
        return load_version_module(root, "kernels/sampling.py")
    except FileNotFoundError as e:
        sys.exit(f"--root: {e}")


def variants(args: argparse.Namespace) -> list[tuple[str, ModuleType, dict]]:
    """(label, module, config changes): each --root version as it is, then this tree per override combination."""
    out = [(os.path.basename(os.path.normpath(root)), load_module(root), {}) for root in args.root]
    this = load_module(None)
    given = [(field, getattr(args, field)) for field in OVERRIDES if getattr(args, field)]
    for combo in itertools.product(*(values for _, values in given)):
        change = {field: v for (field, _), v in zip(given, combo)}
        label = "this" + "".join(f" {OVERRIDES[f]}{v}" for f, v in change.items())
        out.append((label, this, change))
    return out


def seconds_per_call(fn, device: torch.device) -> float:
    """Median seconds of one call: CUDA-graph replays timed by events on CUDA, wall clock on CPU."""
    if device.type == "cuda":
        return graph_seconds(fn, calls=1, replays=REPLAYS)
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
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


def row_kind(kind: str, spread: float, B: int, V: int, device: torch.device) -> torch.Tensor:
    """bf16 logits [B, V]: N(0, spread^2) ("normal"), or a Zipf-like row ("zipf": log-rank slope
    `spread` on a random ranking of the tokens, plus N(0, 0.25) noise)."""
    g = torch.Generator(device=device).manual_seed(1)
    if kind == "normal":
        return (torch.randn(B, V, device=device, generator=g) * spread).bfloat16()
    rank = torch.rand(B, V, device=device, generator=g).argsort(-1).float() + 1
    return (20.0 - spread * rank.log() + torch.randn(B, V, device=device, generator=g) * 0.5).bfloat16()


def resolved_coverage(mod: ModuleType, B: int, V: int, device: torch.device) -> list[dict]:
    """The share of rows the two sweeps resolve (the rest take the fallback search) over row kinds
    and sampling settings, with the module's own config."""
    u = torch.rand(B, device=device, generator=torch.Generator(device=device).manual_seed(2))
    out = []
    for kind, spread in COVERAGE_ROWS:
        x = row_kind(kind, spread, B, V, device)
        for temperature, top_k, top_p in COVERAGE_SETTINGS:
            _, resolved, _ = mod._sample(x, u, temperature, top_k, top_p, mod._config(device, V))
            out.append(dict(kind=kind, spread=spread, temperature=temperature, top_k=top_k, top_p=top_p,
                            resolved=float(resolved.float().mean())))
    return out


def print_table(rows: list[dict]) -> None:
    print(f"\n{'B':>4} {'s':>4} {'k':>3} {'p':>4}  {'version':18s} {'graph us':>9} "
          + " ".join(f"{k.strip('_').removesuffix('_kernel'):>8}" for k in KERNELS) + "  resolved  differ")
    for r in rows:
        ks = " ".join(f"{r['kernels_us'].get(k, float('nan')):8.1f}" for k in KERNELS)
        print(f"{r['B']:4d} {r['spread']:4.1f} {r['top_k']:3d} {r['top_p']:4.2f}  {r['version']:18s} "
              f"{r['us']:9.1f} {ks}  {r['resolved']:8.3f}  {r['differ_from_eager']:6d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", nargs="+", default=[],
                    help="folders each holding another version's oreal_fast/ (baselines)")
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
    out = os.path.join(os.environ.get("OUT", "."), "sweep_sampling.json")

    def save() -> None:
        res["seconds"] = time.time() - t0
        with open(out, "w") as f:
            json.dump(res, f, indent=1)

    for B, spread, top_k, top_p in cases:
        g = torch.Generator(device=device).manual_seed(B)
        x = (torch.randn(B, args.vocab, device=device, generator=g) * spread).bfloat16()
        u = torch.rand(B, device=device, generator=g)
        ref = versions[0][1].sample_from_logits_eager(x, u, top_k=top_k, top_p=top_p)
        for label, mod, change in versions:
            row = dict(B=B, spread=spread, top_k=top_k, top_p=top_p, version=label, config=change)
            row.update(run_case(mod, change, x, u, top_k, top_p, ref))
            res["rows"].append(row)
            save()
        del x
    res["coverage"] = resolved_coverage(versions[-1][1], max(args.batches), args.vocab, device)
    save()
    timing = f"CUDA graph, median of {REPLAYS}" if device.type == "cuda" else "wall clock"
    print(f"{res['device']}, V = {args.vocab}: whole sample_with_logprobs ({timing}) and each kernel's "
          f"GPU time, us; {res['seconds']:.0f} s")
    print_table(res["rows"])
    short = [r for r in res["coverage"] if r["resolved"] < 1.0]
    print(f"\nfallback: {len(short)} of {len(res['coverage'])} row sets (kind x setting, B = {max(args.batches)}) "
          f"below 100 % resolved" + "".join(f"\n  {r['kind']} {r['spread']} T{r['temperature']} k{r['top_k']} "
                                            f"p{r['top_p']}: {r['resolved']:.3f}" for r in short))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
