"""SIGINT and SIGTERM stop the command line at a safe point in each phase of a step (generate, RL
phase, checkpoint write), with one line and exit 130 / 143; ``--resume auto`` then finishes the run
with exactly the metrics of a run that never stopped.

The signalled run is a real subprocess (the tiny random model, the real command line) started in its
own session so that its SIGINT disposition is the default; ``cli_driver.py`` holds it inside the
phase until the test has sent the signal. The straight and the resumed runs go through the same
command line in this process (``train.main``), which saves a process start each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from oreal_fast import trainer
from oreal_fast.metrics import reproducible_metrics
from oreal_fast.train import main

from cli_driver import EvenLengthRouter
from trainer_helpers import write_config

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli_driver.py")
STEPS = 3
# short generations keep each run to a few seconds; every step still trains a kept pair
SMALL = dict(total_steps=STEPS, checkpoint_interval=1, actor_freeze_steps=1, gen_max_new=6,
             gen_max_length=80, debug=False)


def cli(cfg: str, *args: str, hold: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, HOLD=hold or "")
    return subprocess.Popen([sys.executable, "-P", DRIVER, cfg, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def metric_rows(work_dir: str) -> list[dict]:
    (run,) = [d for d in os.listdir(work_dir)]
    with open(os.path.join(work_dir, run, "rank0.log.jsonl")) as f:
        return [reproducible_metrics(json.loads(line)) for line in f]


def wait_for(path: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        assert proc.poll() is None, f"run ended before it reached the hold: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.02)


def in_process(cfg: str, *args: str) -> None:
    """The command line in this process, with the driver's judger; it must finish (exit 0)."""
    real = trainer.Router
    trainer.Router = EvenLengthRouter
    try:
        main([cfg, *args])
    finally:
        trainer.Router = real


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("straight")
    prompts = folder / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"What is {a} + {a}?", "gold_answer": str(2 * a),
                                           "pass_rate": 0.25}) + "\n" for a in range(1, 9)))
    in_process(write_config(folder, tiny_model_dir, tiny_model_dir, str(prompts), **SMALL))
    rows = metric_rows(str(folder / "work"))
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["num_kept"] > 0 for r in rows[1:])
    return str(prompts), rows


@pytest.mark.parametrize("sig, phase, twice, state_after", [
    (signal.SIGINT, "generate", False, 1),    # stops at once; step 2 is redone from state-1
    (signal.SIGINT, "rl", False, 2),          # finishes the RL phase and step 2, saves state-2
    (signal.SIGINT, "checkpoint", False, 2),  # finishes the write of state-2, then stops
    (signal.SIGTERM, "rl", True, 1),          # a second signal exits at once: state-1 stays the newest
])
def test_signal_stops_at_a_safe_point_and_resume_matches_a_straight_run(
        tmp_path, tiny_model_dir, straight, sig, phase, twice, state_after):
    prompts, expected = straight
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompts, **SMALL)
    proc = cli(cfg, hold=f"{phase}:2:{tmp_path}")
    wait_for(str(tmp_path / "held"), proc)
    proc.send_signal(sig)
    if twice:
        wait_for(str(tmp_path / "signalled"), proc)  # the first one was handled: it only set the stop flag
        proc.send_signal(sig)
    (tmp_path / "go").touch()
    code, err = finish(proc)

    assert code == 128 + sig and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    (run,) = os.listdir(tmp_path / "work")
    run_dir = str(tmp_path / "work" / run)
    if twice:
        assert last.startswith(f"{sig.name} again during {phase}: exiting at once")
    else:
        assert last.startswith(f"{sig.name} during step 2 ({phase}): stopped; resume state state-{state_after}.pt "
                               f"({state_after} step(s) done) is on disk")
        assert last.endswith(f"continue with: {os.path.basename(sys.executable)} -m oreal_fast.train {cfg} "
                             f"--resume {run_dir}")
    states = sorted(n for n in os.listdir(os.path.join(run_dir, "resume")) if n.endswith(".pt"))
    assert states[-1] == f"state-{state_after}.pt"
    assert len(metric_rows(str(tmp_path / "work"))) == state_after

    in_process(cfg, "--resume", "auto")
    assert metric_rows(str(tmp_path / "work")) == expected
    assert sorted(d for d in os.listdir(run_dir) if d.startswith("hf-")) == ["hf-1", "hf-2", "hf-3"]
