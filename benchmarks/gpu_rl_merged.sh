#!/usr/bin/env bash
# The RL phase's attention routing and token budget on one GPU, in under 10 minutes on an H100/H200 (the
# steps' limits): the attention backends' GPU tests (by_length_runs against varlen, no host sync), the
# trainer's GPU test, the loop's merged providers (merged: "auto" = by_length, merged_16k, merged_varlen,
# merged_runs: by_length_runs) at the short and mixed shapes, and one micro-batch at 2 x 16384.
#   OUT=results_dir bash benchmarks/gpu_rl_merged.sh [tests] [trainer] [rl_loop] [rl_phase]
# Writes under $OUT: env.txt, steps.txt, *_tests.log, rl_loop.json, rl_phase.json and each step's log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_rl_merged}
export OUT PYTHONPATH=.:benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
STEPS=" ${*:-tests trainer rl_loop rl_phase} "
. benchmarks/gpu_steps.sh
step tests 60 python3 -m pytest -q -p no:cacheprovider tests/model/test_attention_gpu.py > "$OUT/attention_tests.log" 2>&1
step trainer 120 python3 -m pytest -q -p no:cacheprovider tests/trainer/test_trainer_gpu.py > "$OUT/trainer_tests.log" 2>&1
step rl_loop 260 python3 -m pytest -q -p no:cacheprovider benchmarks/test_bench_rl_loop.py --benchmark-only \
  -k "merged" --benchmark-json "$OUT/rl_loop.json" > "$OUT/rl_loop.log" 2>&1
step rl_phase 120 python3 -m pytest -q -p no:cacheprovider benchmarks/test_bench_rl_phase.py --benchmark-only \
  -k "L16384 and (merged or runs)" --benchmark-json "$OUT/rl_phase.json" > "$OUT/rl_phase.log" 2>&1
cat "$OUT/steps.txt"
tail -n 2 "$OUT"/*_tests.log 2>/dev/null
grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.log 2>/dev/null | head -20
python3 - "$OUT" <<'PY'
import sys
from bench_json import show
for name in ("rl_loop", "rl_phase"):
    show(sys.argv[1], name, ("tokens_per_s", "mfu", "peak_gib", "recomputed_blocks", "num_micro_batches"))
PY
