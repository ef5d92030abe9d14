#!/usr/bin/env bash
# The skinny-GEMM layers on one GPU, in under 10 minutes on an H100/H200 (the steps' limits): the
# kernel's bf16 parity tests, the four projections against cuBLAS (benchmarks/test_bench_skinny_gemm.py),
# the decode step with the path off (`-K0` cases) and on (the defaults; `-K64` at 64 rows), the
# engine's GPU tests on the skinny path, decode attention with a shared prompt beside the same shape
# unshared, and the official-shape rollout at the defaults (its engine stats split the time by live batch).
#   OUT=results_dir bash benchmarks/gpu_skinny.sh [tests] [kernel] [decode] [engine] [shared] [official]
# SKINNY_K: a -k expression for the projections' benchmark (default: every case).
# Writes under $OUT: env.txt, steps.txt, *_tests.log, skinny.json, decode.json, rollout_official.json,
# paged_shared.json, and the logs of each step. A failed or slow step does not stop the next one.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_skinny}
export OUT PYTHONPATH=.:benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
STEPS=" ${*:-tests kernel decode engine shared official} "
. benchmarks/gpu_steps.sh
bench() {  # name, seconds, json, file, -k expression
  step "$1" "$2" python3 -m pytest -q -p no:cacheprovider "$4" --benchmark-only ${5:+-k "$5"} \
    --benchmark-json "$OUT/$3.json" > "$OUT/$1.log" 2>&1
}
step tests 50 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py > "$OUT/kernel_tests.log" 2>&1
bench kernel 110 skinny benchmarks/test_bench_skinny_gemm.py "${SKINNY_K:-}"
bench decode 150 decode benchmarks/test_bench_decode.py "K0 or K64 or B4-C128] or B16-C2048] or B16-C128] or B64-C128]"
step engine 100 python3 -m pytest -q -p no:cacheprovider tests/rollout/test_engine_gpu.py -k skinny \
  > "$OUT/engine_tests.log" 2>&1
bench shared 50 paged_shared benchmarks/test_bench_paged_attention.py \
  "oreal_fast and (shared or B1024 or B256-L2048-tight or B64-L8192-tight)"
bench official 130 rollout_official benchmarks/test_bench_rollout.py official
cat "$OUT/steps.txt"
tail -n 2 "$OUT"/*_tests.log 2>/dev/null
python3 - "$OUT" <<'PY'
import sys
from bench_json import cases
out = sys.argv[1]
rows = {}
for b in cases(out, "skinny"):
    e = b["extra_info"]
    rows.setdefault((e["projection"], e["T"]), {})[b["params"]["provider"]] = e["us"]
if rows:
    providers = sorted({p for v in rows.values() for p in v})
    print("projection T  " + "  ".join(providers) + "   (us per call)")
    for (projection, T), v in rows.items():
        print(f"{projection} {T}  " + "  ".join(f"{v.get(p, float('nan')):.2f}" for p in providers))
for b in cases(out, "decode"):
    e = b["extra_info"]
    print(b["param"], {k: e.get(k) for k in ("step_ms", "gpu_ms", "floor_ms", "kernels_per_step")})
for b in cases(out, "rollout_official"):
    print("official", {k: v for k, v in b["extra_info"].items() if k != "oreal_fast_path"})
for b in cases(out, "paged_shared"):
    e = b["extra_info"]
    print(b["name"], {k: e.get(k) for k in ("us", "gb", "gb_unique", "frac_of_copy", "num_splits")})
PY
