#!/usr/bin/env bash
# One GPU session: install, GPU parity tests, tile sweep, the benchmark suite as JSON.
#   OUT=results_dir bash benchmarks/run_gpu.sh [sweep]
# Peers (liger-kernel, cut-cross-entropy) come from wheels in .whl/ when present.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >> "$OUT/env.txt"
timeout 110 python3 -m pytest tests/kernels -q -ra -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
timeout 60 python3 benchmarks/parity_report.py 2>&1 | tee "$OUT/parity.log"
if [ "${1:-}" = sweep ]; then
  timeout 150 python3 benchmarks/sweep_linear_logprob.py --out "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log"
fi
timeout 300 python3 -m pytest benchmarks/ --benchmark-only -q -p no:cacheprovider \
  --benchmark-json "$OUT/bench.json" --benchmark-columns=median,iqr,rounds \
  --benchmark-sort=name 2>&1 | tee "$OUT/bench.log"
