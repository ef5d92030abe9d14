"""scripts/evidence.py gpu: the five GPU runs' commands (resumed where a state exists), and a sitting
bounded in time: runs still going at the deadline get SIGTERM, and the summary counts their steps.
The runs here are stand-in processes (a GPU run is hours), started exactly as the trainer would be."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "evidence.py")

# a stand-in trainer: writes one metrics row, then either ends (exit 0) or waits for SIGTERM and
# records that it got it (exit 5), as the trainer stops at a safe point and writes its state
STAND_IN = """
import json, os, signal, sys, time
work, mode = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(work, "run"), exist_ok=True)
with open(os.path.join(work, "run", "rank0.log.jsonl"), "a") as f:
    f.write(json.dumps({"step": 1}) + "\\n")
def stop(*_):
    open(os.path.join(work, "got_sigterm"), "w").close()
    sys.exit(5)
signal.signal(signal.SIGTERM, stop)
if mode == "long":
    time.sleep(60)
if mode == "fail":
    print("step 1\\rstep 2\\nout of GPU memory in step 2, phase rl: peak 13.55 GiB, cap 14 GiB\\n", flush=True)
    sys.exit(3)
"""


@pytest.fixture(scope="module")
def evidence():
    spec = importlib.util.spec_from_file_location("evidence_gpu_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_commands_name_each_run_its_folder_its_cap_and_resume_where_a_state_exists(evidence, tmp_path):
    resume = tmp_path / "lr0" / "20261207000000" / "resume"
    resume.mkdir(parents=True)
    (resume / "state-20.json").write_text("{}")
    cmds = evidence.gpu_commands(str(tmp_path), 14, ["seed2", "lr0"], extra="--actor /m.gguf --datasets x.jsonl")
    seed2, lr0 = cmds["seed2"], cmds["lr0"]
    assert seed2[1:4] == ["-m", "oreal_fast.train", os.path.join(ROOT, "configs", "evidence_gpu.py")]
    assert seed2[4:] == ["--seed", "2", "--gpu_memory_limit_gib", "14", "--work_dir", str(tmp_path / "seed2"),
                         "--actor", "/m.gguf", "--datasets", "x.jsonl"]
    assert lr0[4:12] == ["--seed", "1", "--actor_lr", "0", "--actor_min_lr", "0", "--gpu_memory_limit_gib", "14"]
    assert lr0[12:16] == ["--work_dir", str(tmp_path / "lr0"), "--resume", "auto"]
    with pytest.raises(ValueError, match="no evidence run 'seed4'"):
        evidence.gpu_commands(str(tmp_path), 14, ["seed1", "seed4"])


def test_a_sitting_ends_the_runs_still_going_at_its_deadline(evidence, tmp_path, monkeypatch, capsys):
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    out = tmp_path / "out"

    def commands(out_dir, cap_gib, names, extra=""):
        modes = {"seed1": "short", "lr0": "long"}
        return {n: [sys.executable, str(stand_in), os.path.join(out_dir, n), modes[n]] for n in names}

    monkeypatch.setattr(evidence, "gpu_commands", commands)
    t0 = time.monotonic()
    evidence.gpu(str(out), seconds=8, names="seed1,lr0")  # the short run ends well before
    assert time.monotonic() - t0 < 40  # the long run (60 s) was stopped, not waited for
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == ["seed1: 1 steps done, exit 0", "lr0: 1 steps done, exit 5"]
    assert (out / "lr0" / "got_sigterm").exists() and not (out / "seed1" / "got_sigterm").exists()
    assert (out / "seed1.log").exists() and (out / "lr0.log").exists()
    # a second sitting appends to the same metrics (the trainer resumes there)
    evidence.gpu(str(out), seconds=8, names="seed1")
    rows = [json.loads(line) for line in open(out / "seed1" / "run" / "rank0.log.jsonl")]
    assert len(rows) == 2 and capsys.readouterr().out.strip().endswith("seed1: 2 steps done, exit 0")


def test_a_run_that_fails_on_its_own_says_why(evidence, tmp_path, monkeypatch, capsys):
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    monkeypatch.setattr(evidence, "gpu_commands", lambda out_dir, cap_gib, names, extra="": {
        n: [sys.executable, str(stand_in), os.path.join(out_dir, n), "fail"] for n in names})
    evidence.gpu(str(tmp_path / "out"), seconds=30, names="shuffled")
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "shuffled: 1 steps done, exit 3 (out of GPU memory in step 2, phase rl: peak 13.55 GiB, cap 14 GiB)")


def test_an_unknown_run_is_one_line_and_exit_2(evidence, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        evidence.gpu(str(tmp_path), names="seed1,seed9")
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == ("evidence gpu: no evidence run 'seed9'; the runs: "
                                               "seed1, seed2, seed3, lr0, shuffled")
