#!/usr/bin/env bash
# The few-token GEMV kernels on one GPU, in about 4 minutes on an H100/H200: their tests (bf16 at
# real shapes, a layer in a CUDA graph, the launch shapes besides the defaults), then the launch-shape
# sweep against cuBLAS with its table.
#   OUT=results_dir bash benchmarks/gpu_decode_gemv.sh
# Writes under $OUT: env.txt, tests.log, sweep_decode_gemv.json + sweep.log, steps.txt.
# Each step has its own time limit, and a failed step does not stop the next one; the table is
# printed from the JSON, so a sweep cut by its limit still shows what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_decode_gemv}
export OUT PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
. benchmarks/gpu_steps.sh
step tests 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gemv.py > "$OUT/tests.log" 2>&1
grep -E "FAILED|Error|passed|failed" "$OUT/tests.log" | tail -8
step sweep 180 python3 benchmarks/sweep_decode_gemv.py > "$OUT/sweep.log" 2>&1
cat "$OUT/steps.txt"
python3 benchmarks/sweep_decode_gemv.py --table "$OUT/sweep_decode_gemv.json" 2>&1 || tail -30 "$OUT/sweep.log"
