"""Launch-shape sweep of the few-token GEMV kernels (`oreal_fast.kernels.decode_gemv`) at the
Qwen2.5-0.5B decode shapes, beside cuBLAS and a device copy.

    python benchmarks/sweep_decode_gemv.py                              # CUDA: under 3 minutes on an H100
    TRITON_INTERPRET=1 python benchmarks/sweep_decode_gemv.py --tiny    # CPU: the logic, small shapes

(from the checkout root, with PYTHONPATH=. so that its oreal_fast is the one imported.)

Kernels, bf16, T in (1, 2, 4) tokens, each on the inputs the engine's layer hands it:
  qkv      norm_linear_rope_kv: the previous down's 3 fp32 partials and the residual through the
           norm into q|k|v [1152, 896] with bias, rope, k and v written into a paged pool
  gate_up  norm_linear with SwiGLU: the o partial and the residual into [2 x 4864, 896]
  o        linear_partials [896, 896] (one split)
  down     linear_partials [896, 4864] (SPLIT_K 2048: 3 partials; the sweep also tries others)
  norm     add_rms_norm_partials of 3 partials (the model's final norm: no weight matrix)
Every weight comes in enough copies to exceed L2 four times (24 at least), and a timed graph
calls each copy once, so every call reads its weights from HBM as a decode step does; the
activations stay in L2 as the previous kernel leaves them. Kernels launch with programmatic
dependent launch where the device has it, as the engine does (--no-pdl: plain launches).

Each call is timed by `gpu_timing.graph_seconds` (one CUDA graph of one call per copy, the median
replay). First the defaults (`decode_gemv._TILES_CUDA`, SPLIT_K) and cuBLAS `F.linear` at the same
weights (the GEMM alone: no norm, rope or SwiGLU) at every kernel and T; then variants of the
`_Tiles` fields (tile_elems, num_warps, product_elems, num_stages; split for down), up to three
changes at once, in order of promise (GRID's order, a combination after its parts), round-robin
over the kernels, until VARIANT_BUDGET_S (--budget-s); a variant whose launch (grid, block sizes,
warps, stages, split) equals one already timed at that T is recorded as the same, not timed again.
Last, the 24 layers (the four kernels each, the attention left out: q is the o projection's input)
and the final norm in one graph, at the defaults and at each kernel's best tiles.

Columns: us per call; GB/s of the weight's bytes; that rate over the copy rate (read + write
bytes of a 1 GiB device-to-device copy, measured in this run); programs launched; the check: per
output (q and the pool's k and v at the slots for qkv, the partials summed over the splits for o
and down, the residual stream where it is written), the largest |kernel - eager twin| over the
largest |twin|, the worst output's: a wrong tile errs by order 1, round-off stays under 4 bf16 eps
(0.031, TOLERANCE); the best variant is the fastest within it.
--tiny: shapes about 14 times smaller, fp32 under TRITON_INTERPRET=1, wall-clock times of single calls
(no graphs, meaningless as speeds). Prints a table; writes $OUT/sweep_decode_gemv.json (OUT
defaults to the current folder), rewritten after every case so that a time limit keeps what ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from gpu_timing import copy_gb_per_s, graph_seconds
from rl_shapes import QWEN25_05B

from oreal_fast.kernels import decode_gemv as dg
from oreal_fast.kernels.common import pdl_available
from oreal_fast.model.decoder import DecoderConfig, rope_table

TOKENS = (1, 2, 4)
KERNELS = ("gate_up", "down", "o", "qkv", "norm")  # in order of promise: the largest shares of a step first
# the (field, value) changes a variant combines, the most promising first: fewer programs re-reading
# the prologue (a larger tile), more loads in flight (more warps), down's split, then the rest
# (a larger token tile reaches T = 4 only; the one loop, over token tiles, runs once or twice)
GRID = (("tile_elems", 16384), ("num_warps", 8), ("split", 1024), ("tile_elems", 4096), ("num_warps", 2),
        ("product_elems", 32768), ("split", 4096), ("tile_elems", 2048), ("num_stages", 1))
GRID_TINY = (("tile_elems", 256), ("num_warps", 2), ("split", 64), ("tile_elems", 128), ("product_elems", 4096),
             ("split", 32), ("num_stages", 1))
TILE_FIELDS = ("tile_elems", "num_warps", "product_elems", "num_stages")
FIELDS = {"gate_up": TILE_FIELDS, "down": (*TILE_FIELDS, "split"), "o": TILE_FIELDS, "qkv": TILE_FIELDS,
          "norm": ("num_warps",)}  # one program per token, no loop: only the warps reach it
MAX_CHANGES = 3
LAYERS = 24
ROTATE_BYTES = 200e6  # the weight copies of one kernel: four times an H100's 50 MB L2
REPLAYS = 10
EPS = 1e-6
TOLERANCE = 4 * torch.finfo(torch.bfloat16).eps
# seconds from the start after which no variant starts (each is a compile per T): with the trunk
# graphs after them the run stays under 3 minutes on an H100
VARIANT_BUDGET_S = 120
TINY_BUDGET_S = 30
TINY = dataclasses.replace(QWEN25_05B, hidden_size=64, intermediate_size=352, num_heads=4, num_kv_heads=2,
                           head_dim=16)


@dataclass
class Weights:
    """Copies of each projection's weight (at least `layers`), and what the kernels share (their
    values do not matter to the time)."""

    config: DecoderConfig
    layers: int  # layers of the trunk graph: the first copies of each weight
    qkv: list[tuple[torch.Tensor, torch.Tensor]]  # ([(Hq + 2 Hkv) D, H], [(Hq + 2 Hkv) D])
    o: list[torch.Tensor]  # [H, Hq D]
    gate_up: list[torch.Tensor]  # [2 I, H]
    down: list[torch.Tensor]  # [H, I]
    norm: torch.Tensor  # [H], every norm's weight
    rope: torch.Tensor  # [P, 2, D] fp32
    k_cache: torch.Tensor  # [64, 16, Hkv, D]
    v_cache: torch.Tensor


def make_weights(c: DecoderConfig, dtype: torch.dtype, device: torch.device, layers: int) -> Weights:
    """Matrices N(0, 0.02^2), the q|k|v bias N(0, 0.5^2), the norm weight 1 + N(0, 0.1^2); on CUDA
    enough copies of each matrix to exceed ROTATE_BYTES."""
    g = torch.Generator(device=device).manual_seed(0)
    H, I, Q = c.hidden_size, c.intermediate_size, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim

    def copies(*shape: int) -> list[torch.Tensor]:
        n = max(layers, math.ceil(ROTATE_BYTES / (math.prod(shape) * dtype.itemsize))) if device.type == "cuda" \
            else layers
        return [(torch.randn(shape, device=device, generator=g) * 0.02).to(dtype) for _ in range(n)]

    qkv = [(W, (torch.randn(Q, device=device, generator=g) * 0.5).to(dtype)) for W in copies(Q, H)]
    pool = torch.zeros(64, 16, c.num_kv_heads, c.head_dim, device=device, dtype=dtype)
    return Weights(c, layers, qkv, copies(H, c.num_heads * c.head_dim), copies(2 * I, H), copies(H, I),
                   (1 + torch.randn(H, device=device, generator=g) * 0.1).to(dtype), rope_table(c, device),
                   pool, pool.clone())


@dataclass
class Inputs:
    """One decode step's activations at T tokens: what each kernel reads from the one before."""

    partials3: torch.Tensor  # [3, T, H] fp32: the down projection's partials
    partials1: torch.Tensor  # [1, T, H] fp32: the o projection's
    residual: torch.Tensor  # [T, H]
    hidden: torch.Tensor  # [T, H]: the normed rows, cuBLAS's input for qkv and gate_up
    attn: torch.Tensor  # [T, Hq D]: the attention output
    act: torch.Tensor  # [T, I]: the SwiGLU activation
    positions: torch.Tensor  # [T] int64
    slots: torch.Tensor  # [T] int64, distinct


def make_inputs(w: Weights, T: int) -> Inputs:
    c, device, dtype = w.config, w.norm.device, w.norm.dtype
    g = torch.Generator(device=device).manual_seed(T)
    H = c.hidden_size

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(shape, device=device, generator=g) * scale

    slots = torch.randperm(w.k_cache.shape[0] * w.k_cache.shape[1], device=device, generator=g)[:T]
    return Inputs(randn(3, T, H), randn(1, T, H), randn(T, H, scale=4.0).to(dtype), randn(T, H).to(dtype),
                  randn(T, c.num_heads * c.head_dim).to(dtype), randn(T, c.intermediate_size).to(dtype),
                  torch.randint(0, 4096, (T,), device=device, generator=g), slots)


def run_qkv(w: Weights, i: int, x: torch.Tensor, r: torch.Tensor, inp: Inputs, tiles: dg._Tiles,
            pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    (W, b), c = w.qkv[i], w.config
    return dg._launch_norm_linear_rope_kv(x, r, w.norm, EPS, W, b, inp.positions, w.rope, w.k_cache, w.v_cache,
                                          inp.slots, x.shape[-2], c.hidden_size, c.num_heads, tiles, pdl)


def run_gate_up(w: Weights, i: int, x: torch.Tensor, r: torch.Tensor, tiles: dg._Tiles,
                pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    c = w.config
    return dg._launch_norm_linear(x, r, w.norm, EPS, w.gate_up[i], None, True, x.shape[-2], c.hidden_size,
                                  c.intermediate_size, tiles, pdl)


def run_partials(W: torch.Tensor, x: torch.Tensor, split: int, tiles: dg._Tiles, pdl: bool) -> torch.Tensor:
    return dg._launch_linear_partials(x, W, None, split, x.shape[0], x.shape[1], W.shape[0], tiles, pdl)


def run_norm(w: Weights, x: torch.Tensor, r: torch.Tensor, tiles: dg._Tiles,
             pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return dg._launch_add_rms_norm_partials(x, r, w.norm, EPS, x.shape[-2], w.config.hidden_size, tiles, pdl)


@dataclass
class Case:
    """One kernel at one T: a launch on weight copy i with (tiles, split); the outputs compared
    with the twin's, and the twin's; the launch's (grid, block sizes); cuBLAS on copy i."""

    launch: Callable[[int, dg._Tiles, int], object]
    outputs: Callable[[object], tuple[torch.Tensor, ...]]
    reference: tuple[torch.Tensor, ...]
    grid: Callable[[dg._Tiles, int], tuple]
    peer: Callable[[int], torch.Tensor] | None
    copies: int
    weight_bytes: int


def make_case(kernel: str, w: Weights, inp: Inputs, pdl: bool) -> Case:
    c, dev = w.config, w.norm.device
    H, T, x3, x1, r = c.hidden_size, inp.residual.shape[0], inp.partials3, inp.partials1, inp.residual
    if kernel == "qkv":
        pools = w.k_cache.clone(), w.v_cache.clone()
        q, r_ref = dg.norm_linear_rope_kv_eager(x3, r, w.norm, EPS, *w.qkv[0], inp.positions, w.rope, *pools,
                                                inp.slots)

        def at_slots(out, pools=(w.k_cache, w.v_cache)):  # (q, residual, k and v at the slots)
            return (*out, *(p.view(-1, *p.shape[2:])[inp.slots] for p in pools))

        return Case(lambda i, t, s: run_qkv(w, i, x3, r, inp, t, pdl), at_slots, at_slots((q, r_ref), pools),
                    lambda t, s: dg._rope_kv_grid(T, H, c.num_heads + 2 * c.num_kv_heads, c.head_dim // 2, t, dev),
                    lambda i: F.linear(inp.hidden, *w.qkv[i]), len(w.qkv), w.qkv[0][0].nbytes + w.qkv[0][1].nbytes)
    if kernel == "gate_up":
        return Case(lambda i, t, s: run_gate_up(w, i, x1, r, t, pdl), tuple,
                    dg.norm_linear_eager(x1, r, w.norm, EPS, w.gate_up[0], swiglu=True),
                    lambda t, s: dg._norm_linear_grid(T, H, c.intermediate_size, True, t, dev),
                    lambda i: F.linear(inp.hidden, w.gate_up[i]), len(w.gate_up), w.gate_up[0].nbytes)
    if kernel in ("o", "down"):
        Ws, x = (w.o, inp.attn) if kernel == "o" else (w.down, inp.act)
        return Case(lambda i, t, s: run_partials(Ws[i], x, s, t, pdl), lambda p: (p.sum(0),),
                    (dg.linear_partials_eager(x, Ws[0]).sum(0),),
                    lambda t, s: dg._linear_partials_grid(T, x.shape[1], Ws[0].shape[0], s, t, dev),
                    lambda i: F.linear(x, Ws[i]), len(Ws), Ws[0].nbytes)
    return Case(lambda i, t, s: run_norm(w, x3, r, t, pdl), tuple, dg.add_rms_norm_partials_eager(x3, r, w.norm, EPS),
                lambda t, s: ((T,), {"BLOCK_H": triton.next_power_of_2(H)}), None, w.layers, 0)


def variants(base: dg._Tiles, grid: tuple[tuple[str, int], ...]) -> list[tuple[str, dict]]:
    """(kernel, changes) of every variant that makes 1 to MAX_CHANGES of grid's changes, to distinct
    fields of the kernel's FIELDS, in order of promise: the sum of the changes' places in grid plus
    one for each change past the first, ties in KERNELS order (so round-robin over the kernels)."""
    ranked = []
    for k, kernel in enumerate(KERNELS):
        options = [(place, field, v) for place, (field, v) in enumerate(grid)
                   if field in FIELDS[kernel] and v != _default(base, field)]
        for n in range(1, MAX_CHANGES + 1):
            for combo in itertools.combinations(options, n):
                if len({field for _, field, _ in combo}) == n:
                    rank = sum(place for place, _, _ in combo) + n - 1
                    ranked.append((rank, k, kernel, {field: v for _, field, v in combo}))
    return [(kernel, change) for _, _, kernel, change in sorted(ranked, key=lambda r: r[:2])]


def _default(base: dg._Tiles, field: str) -> int:
    return dg.SPLIT_K if field == "split" else getattr(base, field)


def label(change: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in change.items()) or "default"


def apply(base: dg._Tiles, change: dict) -> tuple[dg._Tiles, int]:
    """(tiles, split) of a variant."""
    tiles = dataclasses.replace(base, **{k: v for k, v in change.items() if k != "split"})
    return tiles, change.get("split", dg.SPLIT_K)


def call_seconds(fn: Callable[[int], object], copies: int, device: torch.device) -> float:
    """Seconds of fn(i): on CUDA the median over graph replays of fn called once for each weight
    copy i; on CPU one call of fn(0) (the interpreter compiles nothing, and its time means little)."""
    if device.type == "cuda":
        order = itertools.cycle(range(copies))
        return graph_seconds(lambda: fn(next(order)), calls=copies, replays=REPLAYS)
    start = time.perf_counter()
    fn(0)
    return time.perf_counter() - start


def rates(seconds: float, weight_bytes: int, copy_rate: float | None) -> dict:
    """us, and GB/s of the weight's bytes and its share of the copy rate (None without a weight or a copy rate)."""
    gb_per_s = weight_bytes / seconds / 1e9 if weight_bytes else None
    frac = gb_per_s / copy_rate if gb_per_s is not None and copy_rate else None
    return dict(us=seconds * 1e6, gb_per_s=gb_per_s, frac_of_copy=frac)


def launch_key(case: Case, tiles: dg._Tiles, split: int) -> tuple:
    """What a launch is: variants of one key launch one compiled kernel on one grid."""
    grid, blocks = case.grid(tiles, split)
    return tuple(grid), tuple(sorted(blocks.items())), tiles.num_warps, tiles.num_stages, split


def run_variant(case: Case, change: dict, base: dg._Tiles, copy_rate: float | None, seen: dict,
                device: torch.device) -> dict:
    """A row of the variant: its time and check, or the label of the variant whose launch it
    repeats (`seen`: launch key -> label, per kernel and T), or its error."""
    tiles, split = apply(base, change)
    row = dict(variant=label(change), change=change)
    try:
        key = launch_key(case, tiles, split)
        if key in seen:
            return row | dict(same_as=seen[key])
        seen[key] = row["variant"]
        got = case.outputs(case.launch(0, tiles, split))
        diffs = [float((a.float() - b.float()).abs().max()) for a, b in zip(got, case.reference)]
        rel = max(d / float(b.float().abs().max()) for d, b in zip(diffs, case.reference))
        grid, blocks = case.grid(tiles, split)
        row |= rates(call_seconds(lambda i: case.launch(i, tiles, split), case.copies, device), case.weight_bytes,
                     copy_rate)
        row |= dict(programs=math.prod(grid), blocks=blocks, warps=tiles.num_warps, split=split,
                    max_abs_diff=max(diffs), rel_diff=rel, ok=rel <= TOLERANCE)
    except Exception as e:  # a tile that does not compile (registers, shared memory) is a result too
        row["error"] = repr(e)[:300]
    return row


def trunk(w: Weights, inp: Inputs, tiles: dict[str, dg._Tiles], split: int,
          pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """w.layers layers of the four kernels (q standing in for the attention output), then the final norm."""
    x, r = inp.partials3, inp.residual
    T = r.shape[0]
    for layer in range(w.layers):
        q, r = run_qkv(w, layer, x, r, inp, tiles["qkv"], pdl)
        p_o = run_partials(w.o[layer], q.view(T, -1), dg.SPLIT_K, tiles["o"], pdl)
        act, r = run_gate_up(w, layer, p_o, r, tiles["gate_up"], pdl)
        x = run_partials(w.down[layer], act, split, tiles["down"], pdl)
    return run_norm(w, x, r, tiles["norm"], pdl)


def best_changes(rows: list[dict], T: int) -> dict[str, dict]:
    """Each kernel's fastest change at T among the timed rows within the tolerance ({} the default)."""
    timed = [r for r in rows if r["T"] == T and r.get("ok")]
    return {k: min((r for r in timed if r["kernel"] == k), key=lambda r: r["us"])["change"]
            for k in KERNELS if any(r["kernel"] == k for r in timed)}


def time_trunk(w: Weights, inp: Inputs, changes: dict[str, dict], base: dg._Tiles, pdl: bool,
               device: torch.device) -> float:
    """us per layer of `trunk` with each kernel's tiles (and down's split) changed by `changes`."""
    chosen = {k: apply(base, changes.get(k, {})) for k in KERNELS}
    tiles, split = {k: t for k, (t, _) in chosen.items()}, chosen["down"][1]
    return call_seconds(lambda i: trunk(w, inp, tiles, split, pdl), 1, device) * 1e6 / w.layers


def trunk_rows(w: Weights, inputs: dict[int, Inputs], rows: list[dict], base: dg._Tiles, pdl: bool,
               device: torch.device) -> list[dict]:
    """The trunk at each T: at the defaults and with each kernel's best variant."""
    out = []
    for T, inp in inputs.items():
        best = best_changes(rows, T)
        row = dict(T=T, best={k: label(ch) for k, ch in best.items() if ch})
        try:
            row["default_us_per_layer"] = time_trunk(w, inp, {}, base, pdl, device)
            row["best_us_per_layer"] = time_trunk(w, inp, best, base, pdl, device) if row["best"] \
                else row["default_us_per_layer"]
        except Exception as e:  # the kernels' rows are the results; a failed trunk graph only loses its line
            row["error"] = repr(e)[:300]
        out.append(row)
    return out


def print_table(res: dict) -> None:
    rows = res["rows"]
    copy = f"{res['copy_gb_per_s']:.0f} GB/s" if res["copy_gb_per_s"] else "not measured"
    print(f"\n{res['device']}, {res['dtype']}, pdl {res['pdl']}: copy {copy} (read + write), {res['seconds']:.0f} s")
    print("us per call, GB/s of the weight's bytes, % of the copy rate, programs; best: the fastest variant "
          "within the tolerance")
    print(f"{'kernel':8s} {'T':>2s} | {'cuBLAS':>7s} | {'default':>7s} {'GB/s':>5s} {'copy':>4s} {'progs':>5s} | "
          f"{'best':>7s} {'GB/s':>5s} {'copy':>4s} {'progs':>5s} {'gain':>5s}  variant (rel diff)")
    for kernel in KERNELS:
        for T in res["tokens"]:
            mine = [r for r in rows if r["kernel"] == kernel and r["T"] == T]
            peer = next((r for r in mine if r["variant"] == "cublas"), None)
            dflt = next((r for r in mine if r["variant"] == "default" and "us" in r), None)
            timed = [r for r in mine if r.get("ok")]
            if dflt is None or not timed:
                print(f"{kernel:8s} {T:2d} | no default timing: {[r.get('error') for r in mine]}")
                continue
            best = min(timed, key=lambda r: r["us"])
            cublas = f"{peer['us']:7.2f}" if peer else "      -"
            print(f"{kernel:8s} {T:2d} | {cublas} | {_cells(dflt)} | {_cells(best)} "
                  f"{dflt['us'] / best['us']:5.2f}  {best['variant']} ({best['rel_diff']:.1e})")
    bad = [r for r in rows if "error" in r or r.get("ok") is False]
    for r in bad:
        why = r["error"] if "error" in r else f"rel diff {r['rel_diff']:.2e}, outside the tolerance"
        print(f"  {r['kernel']} T {r['T']} {r['variant']}: {why}")
    for r in res["trunk"]:
        best = ", ".join(f"{k}: {v}" for k, v in r["best"].items()) or "all default"
        timing = r["error"] if "error" in r else (f"default {r['default_us_per_layer']:.2f} us a layer, best tiles "
                                                  f"{r['best_us_per_layer']:.2f} us")
        print(f"trunk ({res['layers']} layers, one graph) T {r['T']}: {timing} ({best})")
    counts = {k: sum(1 for r in rows if k in r) for k in ("ok", "same_as", "error")}
    cut = " (the rest past the budget)" if res["variants_run"] < res["variants_total"] else ""
    print(f"variants: {res['variants_run']} of {res['variants_total']} started{cut}; rows "
          f"timed {counts['ok']}, same launch as another {counts['same_as']}, failed {counts['error']}, "
          f"outside the tolerance {sum(1 for r in rows if r.get('ok') is False)}")


def _cells(r: dict) -> str:
    gbs, frac = r.get("gb_per_s"), r.get("frac_of_copy")
    return (f"{r['us']:7.2f} {'-' if gbs is None else f'{gbs:.0f}':>5s} "
            f"{'-' if frac is None else f'{100 * frac:.0f}%':>4s} {r['programs']:5d}")


def sweep(tiny: bool, budget_s: float, no_pdl: bool, path: str) -> dict:
    """The defaults and cuBLAS, the variants until budget_s, the trunk; the results, also written
    to `path` after every case."""
    t0 = time.time()
    config, dtype, device, base, grid, layers = (
        (TINY, torch.float32, torch.device("cpu"), dg._TILES_INTERPRET, GRID_TINY, 2) if tiny
        else (QWEN25_05B, torch.bfloat16, torch.device("cuda"), dg._TILES_CUDA, GRID, LAYERS))
    pdl = not no_pdl and pdl_available(device)
    copy_rate = copy_gb_per_s() if device.type == "cuda" else None
    w = make_weights(config, dtype, device, layers)
    inputs = {T: make_inputs(w, T) for T in TOKENS}
    cases = {(k, T): make_case(k, w, inputs[T], pdl) for k in KERNELS for T in TOKENS}
    todo = variants(base, grid)
    res = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (TRITON_INTERPRET=1)",
               dtype=str(dtype), pdl=pdl, copy_gb_per_s=copy_rate, tokens=TOKENS, layers=layers,
               default_tiles=dataclasses.asdict(base), split_k=dg.SPLIT_K,
               copies={k: cases[(k, TOKENS[0])].copies for k in KERNELS}, rows=[], trunk=[], variants_total=len(todo),
               variants_run=0)

    def save() -> None:
        res["seconds"] = time.time() - t0
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    seen: dict[tuple[str, int], dict] = {key: {} for key in cases}  # per kernel and T: launch key -> label
    for (kernel, T), case in cases.items():  # the defaults and cuBLAS first
        if case.peer is not None:
            seconds = call_seconds(case.peer, case.copies, device)
            peer = dict(kernel=kernel, T=T, variant="cublas")
            res["rows"].append(peer | rates(seconds, case.weight_bytes, copy_rate))
        res["rows"].append(dict(kernel=kernel, T=T) | run_variant(case, {}, base, copy_rate, seen[(kernel, T)], device))
        save()
    for kernel, change in todo:
        if time.time() - t0 > budget_s:
            break
        res["variants_run"] += 1
        for T in TOKENS:
            row = run_variant(cases[(kernel, T)], change, base, copy_rate, seen[(kernel, T)], device)
            res["rows"].append(dict(kernel=kernel, T=T) | row)
        save()
    res["trunk"] = trunk_rows(w, inputs, res["rows"], base, pdl, device)
    save()
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small fp32 shapes, for CPU under TRITON_INTERPRET=1")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"seconds from the start after which no variant starts (default {VARIANT_BUDGET_S}, "
                             f"--tiny {TINY_BUDGET_S})")
    parser.add_argument("--no-pdl", action="store_true", help="plain launches (default: pdl where available)")
    parser.add_argument("--table", metavar="JSON", help="only print the table of a run's JSON (one a time limit cut)")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print_table(json.load(f))
        return
    if args.tiny and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--tiny runs the kernels on CPU: set TRITON_INTERPRET=1")
    if not args.tiny and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --tiny on CPU under TRITON_INTERPRET=1)")
    path = os.path.join(os.environ.get("OUT", "."), "sweep_decode_gemv.json")
    budget = args.budget_s if args.budget_s is not None else TINY_BUDGET_S if args.tiny else VARIANT_BUDGET_S
    print_table(sweep(args.tiny, budget, args.no_pdl, path))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
