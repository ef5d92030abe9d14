#!/usr/bin/env bash
# The decode kernels on one GPU, in under 4 minutes on an H100/H200: the parity tests of paged
# attention and the sampler (bf16 at real shapes, CUDA graphs), the attention tile/split sweep and
# the sampler configuration sweep, the two benchmark suites; a summary table last.
#   OUT=results_dir bash benchmarks/gpu_kernels.sh
# Writes under $OUT: env.txt, tests.log, sweep.json + sweep.log, bench.json + bench.log.
# Each step has its own time limit, and a failed step does not stop the later ones.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_kernels}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
. benchmarks/gpu_steps.sh
step tests 100 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_paged_attention.py tests/kernels/test_sampling_kernel.py > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
step sweep 80 python3 benchmarks/sweep_decode_kernels.py sweep "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
step bench 55 python3 -m pytest -q -p no:cacheprovider --benchmark-only --benchmark-json "$OUT/bench.json" \
  --benchmark-columns=median,iqr,rounds --benchmark-sort=name \
  benchmarks/test_bench_paged_attention.py benchmarks/test_bench_sampling.py > "$OUT/bench.log" 2>&1
tail -2 "$OUT/bench.log"
cat "$OUT/steps.txt"
python3 benchmarks/sweep_decode_kernels.py table "$OUT" 2>&1 || tail -30 "$OUT/sweep.log"
