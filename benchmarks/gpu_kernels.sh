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
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$OUT/env.txt" 2>&1

step() {  # name, seconds, command...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@"
  echo "== $name: exit $? in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$OUT/steps.txt"
}
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
