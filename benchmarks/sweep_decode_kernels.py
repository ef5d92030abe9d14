"""Tile and split sweep of the paged decode attention kernel, configuration sweep of the sampler,
and the summary table of a GPU session's decode-kernel results.

    python benchmarks/sweep_decode_kernels.py sweep OUT.json   # CUDA: measure, write JSON, print
    python benchmarks/sweep_decode_kernels.py table DIR         # print DIR/sweep.json + DIR/bench.json

Attention: Qwen2.5-0.5B heads (14 / 2 / 64, bf16, 16-token blocks in random order), each shape
under every (block_n, num_warps, num_stages) and split target (programs per SM), timed as a CUDA
graph of 20 calls; GB/s counts the K and V bytes a call must read. Sampler: B = 256, V = 151936,
bf16 N(0, spread^2) rows (and Zipf-like ones), each configuration's median time, the share of each
kernel (torch.profiler) and the fraction of rows resolved by the two sweeps (the rest fall back).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time

import torch

pa = importlib.import_module("oreal_fast.kernels.paged_attention")
smp = importlib.import_module("oreal_fast.kernels.sampling")

HQ, HKV, D, BLOCK, V = 14, 2, 64, 16, 151936
ATTN_SHAPES = [(256, 2048, 2048), (64, 8192, 8192), (256, 128, 128), (16, 128, 128), (1, 128, 16384)]
TILE_SHAPES = [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2), (64, 8, 3), (128, 4, 2),
               (128, 4, 3)]  # (block_n, num_warps, num_stages)
PROGRAMS_PER_SM = (2, 4, 8)
SAMPLER_CONFIGS = {
    "default": {},
    "chunk4096": dict(chunk=4096),
    "bins128": dict(num_bins=128, bins_per_doubling=16, units_per_log2=64.0),
    "sweep_warps4": dict(sweep_warps=4),
    "cap16384": dict(cap=16384, budget=4000),
}


def gpu_seconds(fn, calls: int = 20, replays: int = 7) -> float:
    """Median seconds per call of fn, as a CUDA graph of `calls` calls replayed `replays` times."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    graph.reset()
    return sorted(times)[replays // 2]


def copy_gb_per_s() -> float:
    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / gpu_seconds(lambda: dst.copy_(src), calls=4) / 1e9


def attention_inputs(B: int, L: int, table_tokens: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    used = L // BLOCK
    q = torch.randn(B, HQ, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(B * used, BLOCK, HKV, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.zeros(B, table_tokens // BLOCK, dtype=torch.int32, device="cuda")
    tables[:, :used] = torch.randperm(B * used, device="cuda", generator=g).int().view(B, used)
    return q, k, v, tables, torch.full((B,), L, dtype=torch.int32, device="cuda")


def sweep_attention(copy_rate: float) -> list[dict]:
    rows = []
    dev = torch.device("cuda")
    for B, L, table_tokens in ATTN_SHAPES:
        args = attention_inputs(B, L, table_tokens)
        ref = pa.paged_decode_attention_eager(*args).float()
        for block_n, warps, stages in TILE_SHAPES:
            for per_sm in PROGRAMS_PER_SM:
                tiles = dataclasses.replace(pa._TILES_CUDA, block_n=block_n, num_warps=warps,
                                            num_stages=stages, programs_per_sm=per_sm)
                splits = pa._num_splits(B, HKV, table_tokens, tiles, dev)
                fn = lambda: pa._launch(*args, D ** -0.5, None, tiles)  # noqa: E731
                try:
                    err = float((fn().float() - ref).abs().max())
                    s = gpu_seconds(fn)
                except Exception as e:  # a tile that does not fit (shared memory) is a result too
                    rows.append(dict(B=B, L=L, table=table_tokens, block_n=block_n, warps=warps,
                                     stages=stages, programs_per_sm=per_sm, error=repr(e)[:200]))
                    continue
                gbs = 2 * B * L * HKV * D * 2 / s / 1e9
                rows.append(dict(B=B, L=L, table=table_tokens, block_n=block_n, warps=warps,
                                 stages=stages, programs_per_sm=per_sm, splits=splits, us=s * 1e6,
                                 gb_per_s=gbs, frac_of_copy=gbs / copy_rate, max_abs_err=err))
        torch.cuda.empty_cache()
    return rows


def sampler_rows(kind: str, spread: float, B: int = 256) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(1)
    if kind == "normal":
        return (torch.randn(B, V, device="cuda", generator=g) * spread).bfloat16()
    rank = torch.rand(B, V, device="cuda", generator=g).argsort(-1).float() + 1  # a random rank per token
    noise = torch.randn(B, V, device="cuda", generator=g) * 0.5
    return (20.0 - spread * rank.log() + noise).bfloat16()


def kernel_shares(fn) -> dict[str, float]:
    """Device microseconds per call of each kernel fn launches (10 calls under torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / 10 for e in prof.key_averages() if e.device_time_total > 0}


def sweep_sampler() -> dict:
    out = {"configs": [], "resolved": [], "kernels": {}}
    g = torch.Generator(device="cuda").manual_seed(2)
    u = torch.rand(256, device="cuda", generator=g)
    for name, change in SAMPLER_CONFIGS.items():
        cfg = dataclasses.replace(smp._CUDA, **change)
        for spread in (0.6, 1.0, 3.0):
            x = sampler_rows("normal", spread)
            fn = lambda: smp._sample(x, u, 1.0, 0, 0.9, cfg)  # noqa: E731
            resolved = float(fn()[1].float().mean())
            out["configs"].append(dict(config=name, spread=spread, ms=gpu_seconds(fn, calls=5) * 1e3,
                                       resolved=resolved))
    x = sampler_rows("normal", 3.0)
    for mode, (top_k, top_p) in {"top_p": (0, 0.9), "top_k_top_p": (20, 0.9), "plain": (0, 1.0)}.items():
        out["kernels"][mode] = kernel_shares(lambda: smp._sample(x, u, 1.0, top_k, top_p, smp._CUDA))
    for kind, spread in [("normal", 0.3), ("normal", 0.6), ("normal", 1.0), ("normal", 3.0),
                         ("zipf", 0.7), ("zipf", 1.0), ("zipf", 2.0)]:
        x = sampler_rows(kind, spread)
        for temperature, top_k, top_p in [(1.0, 0, 0.9), (0.7, 20, 0.9), (1.0, 0, 0.5), (1.3, 0, 0.95)]:
            _, resolved = smp._sample(x, u, temperature, top_k, top_p, smp._CUDA)
            out["resolved"].append(dict(kind=kind, spread=spread, temperature=temperature, top_k=top_k,
                                        top_p=top_p, resolved=float(resolved.float().mean())))
    return out


def print_sweep(res: dict) -> None:
    print(f"\n{res['device']}: copy {res['copy_gb_per_s']:.0f} GB/s (read + write)")
    if "sampler" in res:
        print_sampler(res["sampler"])
    print("attention: best tiles per shape (and the default's)")
    default = pa._TILES_CUDA
    for B, L, table in ATTN_SHAPES if "attention" in res else ():
        rows = [r for r in res["attention"] if (r["B"], r["L"], r["table"]) == (B, L, table) and "us" in r]
        best = min(rows, key=lambda r: r["us"], default=None)
        dflt = next((r for r in rows if (r["block_n"], r["warps"], r["stages"], r["programs_per_sm"])
                     == (default.block_n, default.num_warps, default.num_stages, default.programs_per_sm)), None)
        for tag, r in (("best", best), ("default", dflt)):
            if r is None:
                continue
            print(f"  B{B:<4} L{L:<5} table {table:<5} {tag:7s} n{r['block_n']} w{r['warps']} s{r['stages']} "
                  f"p{r['programs_per_sm']} splits {r['splits']:2d}: {r['us']:7.1f} us {r['gb_per_s']:6.0f} GB/s "
                  f"({100 * r['frac_of_copy']:.0f} % of copy) err {r['max_abs_err']:.1e}")


def print_sampler(res: dict) -> None:
    print("sampler (B256, top-p 0.9): config, spread -> ms, resolved")
    for r in res["configs"]:
        print(f"  {r['config']:14s} spread {r['spread']:3.1f}: {r['ms']:.3f} ms resolved {r['resolved']:.3f}")
    for mode, shares in res["kernels"].items():
        print(f"  kernels {mode}: " + ", ".join(f"{k} {v:.1f} us" for k, v in sorted(shares.items())))
    bad = [r for r in res["resolved"] if r["resolved"] < 1.0]
    print(f"  fallback rows: {len(bad)} of {len(res['resolved'])} row sets below 100 % resolved")
    for r in bad:
        print(f"    {r['kind']} {r['spread']} T{r['temperature']} k{r['top_k']} p{r['top_p']}: {r['resolved']:.3f}")


def print_bench(bench: dict) -> None:
    """One line per benchmark case group: oreal_fast vs start vs peers."""
    cases: dict[tuple, dict] = {}
    for b in bench["benchmarks"]:
        name, provider = b["name"].split("[", 1)[0], b["params"]["provider"]
        key = (name, b["name"].split("[", 1)[1].rsplit("-", 1)[0])
        cases.setdefault(key, {})[provider] = b["extra_info"]
    for (name, case), by in sorted(cases.items()):
        if name == "test_paged_decode_attention":
            cells = [f"{p} {e['us']:7.1f} us {e['gb_per_s']:5.0f} GB/s {100 * e['frac_of_copy']:3.0f}%"
                     for p, e in sorted(by.items())]
        else:
            cells = [f"{p} {e['ms']:.3f} ms" + (f" res {e['resolved']:.2f}" if "resolved" in e else "")
                     for p, e in sorted(by.items())]
        print(f"  {case:28s} " + " | ".join(cells))


def main(argv: list[str]) -> None:
    if argv[:1] == ["sweep"]:
        # the sampler first, and the JSON rewritten after each part: a time limit keeps what ran
        t0 = time.time()
        res = {"device": torch.cuda.get_device_name(), "copy_gb_per_s": copy_gb_per_s()}
        for part, run in (("sampler", sweep_sampler), ("attention", lambda: sweep_attention(res["copy_gb_per_s"]))):
            res[part] = run()
            res[f"{part}_done_s"] = time.time() - t0
            with open(argv[1], "w") as f:
                json.dump(res, f, indent=1)
        print_sweep(res)
    elif argv[:1] == ["table"]:
        for name, show in (("sweep.json", print_sweep), ("bench.json", print_bench)):
            try:
                with open(f"{argv[1]}/{name}") as f:
                    show(json.load(f))
            except (OSError, KeyError, ValueError) as e:
                print(f"{name}: {e!r}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
