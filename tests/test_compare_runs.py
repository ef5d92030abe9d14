"""benchmarks/compare_runs.py: which metrics of two runs differ, timings and host counters left out."""

import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "compare_runs.py")


def _load():
    spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_lists_changed_and_one_sided_metrics_and_ignores_timings(tmp_path):
    a = _write(tmp_path / "a.jsonl", [
        {"step": 1, "rl_loss": 0.5, "rl_time": 3.0, "rl_tgs": 100, "eta": 9, "max_memory": 1.0, "rollout_tokens_per_s": 7.0,
         "host_rss_gib": 1.5, "open_fds": 40, "judge_workers": 2, "gpu_allocated_gib": 3.0, "gpu_reserved_gib": 4.0},
        {"step": 2, "rl_loss": 0.25, "avg_new_tokens": 10.0, "rollout_time_s": 1.0},
        {"step": 3, "rl_loss": 0.1},
    ])
    b = _write(tmp_path / "b.jsonl", [
        {"step": 1, "rl_loss": 0.5, "rl_time": 4.0, "rl_tgs": 90, "eta": 8, "max_memory": 2.0, "rollout_tokens_per_s": 6.0,
         "host_rss_gib": 1.7, "open_fds": 41, "judge_workers": 1, "gpu_allocated_gib": 3.5, "gpu_reserved_gib": 4.5},
        {"step": 2, "rl_loss": 0.3, "num_kept": 2, "rollout_time_s": 2.0},
    ])
    report = _load().compare(a, b)
    assert report["steps_a"] == [1, 2, 3] and report["steps_b"] == [1, 2]
    # step 1 differs only in timings, throughput, memory and health counters; step 3 is in one run only
    assert report["differences"] == {2: {"rl_loss": [0.25, 0.3], "avg_new_tokens": [10.0, None], "num_kept": [None, 2]}}


def test_a_line_that_is_not_json_is_one_line_and_exit_2(tmp_path):
    good = _write(tmp_path / "good.jsonl", [{"step": 1}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{oops\n')
    proc = subprocess.run([sys.executable, SCRIPT, good, str(bad), "--out", str(tmp_path / "out.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"compare_runs: {bad}:2: not valid JSON")
    assert not (tmp_path / "out.json").exists()
