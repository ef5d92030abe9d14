#!/usr/bin/env bash
# The RL phase's GPU evidence in one call (under 5 minutes on an H100 / H200), results under $OUT:
#   OUT=results_dir bash benchmarks/run_rl_phase_gpu.sh
#   gpu_tests.log      bf16 parity of the trainable trunk kernels at real shapes (tests/kernels/test_trunk_train.py),
#                      the RL phase with no host sync and TRAIN_OPS training as the eager ops
#                      and weights_cast_once giving autocast's gradients, merged_projections giving the
#                      separate projections' gradients (tests/trainer/test_rl_phase_gpu.py),
#                      the activation formula against what autograd saves with varlen attention
#                      (tests/test_recompute.py)
#   rl_loop.json       test_bench_rl_loop.py, our split with and without weights_cast_once, and with it and
#                      merged_projections (short and mixed shapes, 40 GiB cap)
#   rl_phase_L16384.json, rl_phase_L4096.json
#                      test_bench_rl_phase.py: defaults, fused loss, eager trunk, recompute none / half / full,
#                      weights cast once, merged projections, hf_plain (L4096)
#   trunk_ops.json     test_bench_trunk_ops.py: eager, ours, liger (from .whl/ when carried), the projections
#   trunk_ops_compile.json  the same suite's torch.compile cases (compiling takes most of their time)
#   rl_loop_profile.json  torch.profiler of one phase, ours and with the eager trunk: busy fraction, syncs, kernels
#   summary.txt        the table printed at the end
# Each part has its own time limit (pytest-benchmark writes its JSON only at the end of a suite), so a
# slow part loses only its own JSON; the parts run most wanted first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/rl_phase}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # liger-kernel as a benchmark peer, pure Python
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  | tee "$OUT/env.txt"
for t in tests/kernels/test_trunk_train.py tests/trainer/test_rl_phase_gpu.py tests/test_recompute.py; do
  timeout 60 python3 -m pytest "$t" -q -ra -p no:cacheprovider 2>&1 | tail -n 15 | tee -a "$OUT/gpu_tests.log"
done
bench() {  # file, -k expression, output name, time limit
  timeout "$4" python3 -m pytest "$1" --benchmark-only -q -p no:cacheprovider ${2:+-k "$2"} \
    --benchmark-json "$OUT/$3.json" --benchmark-columns=median,rounds --benchmark-sort=name 2>&1 \
    | tail -n 40 > "$OUT/$3.log"
}
bench benchmarks/test_bench_rl_loop.py "oreal_fast or cast_once or merged" rl_loop 110
bench benchmarks/test_bench_rl_phase.py "L16384 and not oreal_fast_eager" rl_phase_L16384 90
bench benchmarks/test_bench_rl_phase.py "L4096 and not oreal_fast_eager" rl_phase_L4096 55
bench benchmarks/test_bench_trunk_ops.py "not torch_compile" trunk_ops 40
PYTHONPATH=benchmarks:${PYTHONPATH:-} timeout 35 python3 benchmarks/profile_rl_loop.py --out "$OUT/rl_loop_profile.json" \
  --variants oreal_fast trunk_eager > "$OUT/profile.log" 2>&1
bench benchmarks/test_bench_trunk_ops.py torch_compile trunk_ops_compile 50
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
for name in ("rl_loop", "rl_phase_L16384", "rl_phase_L4096", "trunk_ops", "trunk_ops_compile"):
    path = os.path.join(out, name + ".json")
    try:
        runs = json.load(open(path))["benchmarks"]
    except (OSError, ValueError):
        print(f"{name}: no results (see {name}.log)")
        continue
    print(f"== {name}")
    for b in runs:
        x = b["extra_info"]
        cols = [f"{b['stats']['median'] * 1e3:9.1f} ms"]
        cols += [f"{k} {x[k]:.4g}" for k in ("ms", "tokens_per_s", "mfu", "hfu", "gb_per_s", "peak_gib",
                                              "peak_extra_gib", "recomputed_blocks", "num_micro_batches") if k in x]
        print(f"{b['name']:58s} " + "  ".join(cols))
path = os.path.join(out, "rl_loop_profile.json")
for r in json.load(open(path)) if os.path.exists(path) else []:
    print(f"profile {r['variant']:>12}: wall {r['wall_ms']:.0f} ms, busy {100 * r['busy_fraction']:.1f} %, "
          f"{r['tokens_per_s']:.0f} tok/s, {r['num_kernels']} kernels, {r['host_syncs']} syncs")
EOF
grep -h -E "passed|failed|error" "$OUT/gpu_tests.log" | tee -a "$OUT/summary.txt"
