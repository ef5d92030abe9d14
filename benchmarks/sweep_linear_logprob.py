"""Tile-size sweep for oreal_fast.kernels.linear_logprob on one GPU (picks the module's defaults).

    python benchmarks/sweep_linear_logprob.py [--out sweep.json]

Times, at T = 16384, H = 896, V = 151936 bf16: the forward (no grad, with and without entropy)
for each forward tiling and programs-per-SM, and forward + backward for each dz tiling and dz
chunk size. Prints a table and writes every number as JSON. Not collected by pytest.
"""

import argparse
import importlib
import json

import torch
import triton
from triton.testing import do_bench

ll = importlib.import_module("oreal_fast.kernels.linear_logprob")
B = ll._Blocks

FWD = [B(128, 256, 64, 8, 3), B(128, 256, 64, 8, 4), B(256, 128, 64, 8, 3), B(128, 256, 128, 8, 2),
       B(128, 128, 64, 8, 4)]
DZ = [B(128, 256, 64, 8, 3), B(128, 256, 64, 8, 4), B(256, 128, 64, 8, 3), B(128, 128, 64, 8, 4)]
MIN_SPLITS = [4, 8, 16]
CHUNK_MIB = [128, 256, 512]


def _inputs(T=16384, H=896, V=151936):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = (torch.randn(T, H, device="cuda", generator=g) * 4 / H**0.5).bfloat16()
    w = torch.randn(V, H, device="cuda", generator=g).bfloat16()
    lab = torch.randint(0, V, (T,), device="cuda", generator=g)
    return h, w, lab, torch.randn(T, device="cuda", generator=g)


def _time(fn) -> float:
    return do_bench(fn, warmup=100, rep=400, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sweep.json")
    out = ap.parse_args().out
    h, w, lab, g = _inputs()
    flop = 2 * h.shape[0] * w.shape[0] * h.shape[1]
    rows = []

    def fwd(ent):
        with torch.no_grad():
            return ll.linear_logprob(h, w, lab, return_entropy=ent)

    def policy():
        hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
        (ll.linear_logprob(hh, ww, lab) * g).sum().backward()

    min_splits = ll._MIN_SPLITS
    mm = _time(lambda: h @ w.T)
    rows.append(dict(what="cublas h@w.T", ms=mm, tflops=flop / mm / 1e9))
    dz = torch.randn(h.shape[0], 8192, device="cuda").bfloat16()
    for name, fn in [("mm out_dtype fp32", lambda: torch.mm(dz, w[:8192], out_dtype=torch.float32)),
                     ("mm bf16", lambda: dz @ w[:8192])]:
        try:
            ms = _time(fn)
            rows.append(dict(what=name, ms=ms, tflops=2 * dz.numel() * h.shape[1] / ms / 1e9))
        except (RuntimeError, TypeError) as e:
            rows.append(dict(what=name, error=str(e)[:80]))
    for b in FWD:
        ll._FWD_BLOCKS_CUDA = b
        for ms_ in MIN_SPLITS:
            ll._MIN_SPLITS = ms_
            for ent in (False, True):
                try:
                    ms = _time(lambda: fwd(ent))
                except triton.runtime.errors.OutOfResources as e:
                    rows.append(dict(what="fwd", blocks=str(b), error=str(e)[:80]))
                    break
                rows.append(dict(what=f"fwd ent={ent} splits>={ms_}", blocks=str(b), ms=ms,
                                 tflops=flop / ms / 1e9))
    best_fwd = min((r for r in rows if r["what"].startswith("fwd ent=False") and "ms" in r),
                   key=lambda r: r["ms"])
    ll._MIN_SPLITS = min_splits
    ll._FWD_BLOCKS_CUDA = next(b for b in FWD if str(b) == best_fwd["blocks"])
    for b in DZ:
        ll._DZ_BLOCKS_CUDA = b
        try:
            ms = _time(policy)
        except triton.runtime.errors.OutOfResources as e:
            rows.append(dict(what="policy dz", blocks=str(b), error=str(e)[:80]))
            continue
        rows.append(dict(what="policy dz", blocks=str(b), ms=ms, tflops=3 * flop / ms / 1e9))
    best_dz = min((r for r in rows if r["what"] == "policy dz" and "ms" in r), key=lambda r: r["ms"])
    ll._DZ_BLOCKS_CUDA = next(b for b in DZ if str(b) == best_dz["blocks"])
    for mib in CHUNK_MIB:
        ll._DZ_CHUNK_BYTES = mib * 2**20
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ms = _time(policy)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        rows.append(dict(what=f"policy chunk={mib}MiB", ms=ms, peak_gib=peak))
    for r in rows:
        print(f"{r['what']:<26} {r.get('blocks', ''):<75} {r.get('ms', float('nan')):8.3f} ms "
              f"{r.get('tflops', float('nan')):6.0f} TF/s {r.get('peak_gib', '')} {r.get('error', '')}")
    print("best fwd:", best_fwd)
    print("best dz:", best_dz)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
