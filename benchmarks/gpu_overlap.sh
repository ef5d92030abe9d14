#!/usr/bin/env bash
# Overlapped decode rounds on one GPU, in 5 minutes at most on an H100/H200 (the steps' limits): the
# engine's and the trainer's GPU tests (with rounds overlapped, the default), then the decode step at
# 1, 16 and 256 rows @128 with rounds overlapped and read in turn (benchmarks/test_bench_decode.py:
# each `-noO` case against the default case of its batch, in one pytest session per batch).
#   OUT=results_dir bash benchmarks/gpu_overlap.sh [tests] [decode]   (no name: both)
# Writes under $OUT: env.txt, tests.log, decode_B{1,16,256}.json + decode.log, steps.txt.
# Each step has its own time limit, and a failed step does not stop the next one.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_overlap}
export OUT PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
STEPS=" ${*:-tests decode} "
. benchmarks/gpu_steps.sh
step tests 140 python3 -m pytest -q -p no:cacheprovider tests/rollout/test_engine_gpu.py tests/trainer/test_trainer_gpu.py \
  > "$OUT/tests.log" 2>&1
step decode 160 bash -c 'for b in 1 16 256; do
  python3 -m pytest -q -p no:cacheprovider benchmarks/test_bench_decode.py --benchmark-only \
    -k "B$b-C128] or B$b-C128-noO]" --benchmark-json "$OUT/decode_B$b.json"; done' > "$OUT/decode.log" 2>&1
cat "$OUT/steps.txt"
[ -s "$OUT/tests.log" ] && grep -E "FAILED|Error|passed|failed" "$OUT/tests.log" | tail -8
python3 benchmarks/decode_report.py "$OUT"/decode_B*.json
python3 - "$OUT"/decode_B*.json <<'PY'
import json, sys
print("decode step @128, ms: wall (overlapped | read in turn), GPU (overlapped | read in turn), wall / GPU (overlapped | read in turn)")
for path in sys.argv[1:]:
    try:
        cases = {b["param"]: b["extra_info"] for b in json.load(open(path))["benchmarks"]}
    except (OSError, ValueError, KeyError):
        continue  # a batch that timed out saved nothing
    for name, on in cases.items():
        off = cases.get(name + "-noO")
        if off is not None:
            print(f"{name}: {on['step_ms']:.3f} | {off['step_ms']:.3f}   {on['gpu_ms']:.3f} | {off['gpu_ms']:.3f}"
                  f"   {on['wall_over_gpu']:.3f} | {off['wall_over_gpu']:.3f}")
PY
