# Sourced by the benchmarks/gpu_*.sh scripts (after `cd` to the repository root, with OUT set): the
# versions line into $OUT/env.txt, and `step NAME SECONDS COMMAND...`, which runs one step under its
# own time limit and appends its exit status and time to $OUT/steps.txt, so a slow or failed step
# does not stop the later ones. With STEPS set (" name name "), only the steps it names run.
mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$OUT/env.txt" 2>&1

step() {  # name, seconds, command...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  [[ -z ${STEPS:-} || $STEPS == *" $name "* ]] || return 0
  timeout "$limit" "$@"
  echo "== $name: exit $? in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$OUT/steps.txt"
}
