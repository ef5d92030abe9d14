"""Tile and split sweep of the paged decode attention kernel, and the summary table of a GPU
session's decode-kernel results (the sampler's sweep: benchmarks/sweep_sampling.py).

    python benchmarks/sweep_decode_kernels.py sweep OUT.json   # CUDA: measure, write JSON, print
    python benchmarks/sweep_decode_kernels.py table DIR         # print DIR/sweep.json + DIR/bench.json

Attention: Qwen2.5-0.5B heads (14 / 2 / 64, bf16, 16-token blocks in random order), each shape
under every (block_n, num_warps, num_stages) and split target (programs per SM), timed as a CUDA
graph of 20 calls (`gpu_timing.graph_seconds`); GB/s counts the K and V bytes a call must read.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time

import torch

from gpu_timing import copy_gb_per_s, graph_seconds

pa = importlib.import_module("oreal_fast.kernels.paged_attention")

HQ, HKV, D, BLOCK = 14, 2, 64, 16
ATTN_SHAPES = [(256, 2048, 2048), (64, 8192, 8192), (256, 128, 128), (16, 128, 128), (1, 128, 16384)]
TILE_SHAPES = [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2), (64, 8, 3), (128, 4, 2),
               (128, 4, 3)]  # (block_n, num_warps, num_stages)
PROGRAMS_PER_SM = (2, 4, 8)


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
                    s = graph_seconds(fn)
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


def print_sweep(res: dict) -> None:
    print(f"\n{res['device']}: copy {res['copy_gb_per_s']:.0f} GB/s (read + write)")
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
        t0 = time.time()
        res = {"device": torch.cuda.get_device_name(), "copy_gb_per_s": copy_gb_per_s()}
        res["attention"] = sweep_attention(res["copy_gb_per_s"])
        res["attention_done_s"] = time.time() - t0
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
