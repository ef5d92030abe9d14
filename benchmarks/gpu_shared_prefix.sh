#!/usr/bin/env bash
# The shared-prefix decode attention on one GPU, in under 10 minutes on an H100/H200 (the steps' limits):
# its bf16 and CUDA-graph tests, the engine's GPU tests (every layer path, and the shared-prefix
# attention) and the trainer's GPU test at the defaults, the kernel with and without `shared` on the
# shared-prompt cases beside their unshared twins, and the official-shape rollout with and without
# `shared_prefix_min_rows` 64 (its engine stats split the time by live batch); with `skinny` named, the
# skinny GEMM's tile variants at 16-64 tokens (not in the default list: the five above take ~9 minutes).
#   OUT=results_dir bash benchmarks/gpu_shared_prefix.sh [tests] [kernel] [official] [engine] [trainer] [skinny]
# Writes under $OUT: env.txt, steps.txt, *_tests.log, paged_shared.json, rollout_official.json,
# skinny.json and the logs of each step. A failed or slow step does not stop the next one.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_shared_prefix}
export OUT PYTHONPATH=.:benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
STEPS=" ${*:-tests kernel official engine trainer} "
. benchmarks/gpu_steps.sh
bench() {  # name, seconds, json, file, -k expression
  step "$1" "$2" python3 -m pytest -q -p no:cacheprovider "$4" --benchmark-only ${5:+-k "$5"} \
    --benchmark-json "$OUT/$3.json" > "$OUT/$1.log" 2>&1
}
# most wanted first: the kernel's GPU tests, its timing, the rollout; then the engine's and trainer's tests
step tests 50 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_attention.py -k "bf16 or graph" \
  > "$OUT/kernel_tests.log" 2>&1
bench kernel 50 paged_shared benchmarks/test_bench_paged_attention.py \
  "oreal_fast and (shared or B1024-L1024-tight or B256-L2048-tight or B64-L8192-tight or B16-L2048-tight)"
bench official 170 rollout_official benchmarks/test_bench_rollout.py official
step engine 170 python3 -m pytest -q -p no:cacheprovider tests/rollout/test_engine_gpu.py > "$OUT/engine_tests.log" 2>&1
step trainer 110 python3 -m pytest -q -p no:cacheprovider tests/trainer/test_trainer_gpu.py > "$OUT/trainer_tests.log" 2>&1
# only when named: the skinny GEMM's tile variants against cuBLAS where its default loses (16-64 tokens)
bench skinny 200 skinny benchmarks/test_bench_skinny_gemm.py "(gate_up or down) and (-16- or -32- or -64-)"
cat "$OUT/steps.txt"
tail -n 2 "$OUT"/*_tests.log 2>/dev/null
grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.log 2>/dev/null | head -20
python3 - "$OUT" <<'PY'
import sys
from bench_json import cases, show
out = sys.argv[1]
show(out, "paged_shared", ("us", "gb", "gb_unique", "frac_of_copy", "num_splits"))
for b in cases(out, "skinny"):
    print(b["name"], round(b["extra_info"]["us"], 2), "us")
show(out, "rollout_official")
PY
