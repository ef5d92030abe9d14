"""The embedded demo end to end for 2 steps, as the README's first command runs it: the official
metric keys in order, a checkpoint folder transformers loads, the plot command, and the held-out
validation before and after training."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import torch

from oreal_fast.metrics import OFFICIAL_KEYS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the demo run is this file's first test's setup: about 6 minutes on two idle cores, 9 beside another
# test process (scripts/test.sh runs two)
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> str:
    work_dir = tmp_path_factory.mktemp("demo")
    cmd = [sys.executable, "-m", "oreal_fast.train", os.path.join(REPO, "configs", "demo.py"),
           "--total_steps", "2", "--checkpoint_interval", "2", "--work_dir", str(work_dir)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = glob.glob(os.path.join(work_dir, "*", ""))
    return run_dir


def test_demo_logs_every_official_key_in_order(demo_run):
    with open(os.path.join(demo_run, "rank0.log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert tuple(r)[: len(OFFICIAL_KEYS)] == OFFICIAL_KEYS
    first = rows[0]
    assert first["actor_lr"] == 0.0 and first["actor_grad_norm"] == 0.0  # frozen for step 1
    if first["num_kept"]:
        assert first["token_level_rm_loss"] == pytest.approx(0.6931472, abs=1e-5)  # zero RM head: ln 2


def test_demo_checkpoint_loads_in_transformers(demo_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = os.path.join(demo_run, "hf-2")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()
    assert "helpful math assistant" in tok.chat_template  # the config's template travels with the weights


def test_demo_trajectories_and_plot(demo_run):
    assert os.path.isfile(os.path.join(demo_run, "trajectories", "step.0.jsonl"))
    out = subprocess.run([sys.executable, "-m", "oreal_fast.plot", demo_run], capture_output=True, text=True,
                         timeout=300, check=True)
    png = out.stdout.strip().splitlines()[-1]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_demo_validates_held_out_problems_before_and_after_training(demo_run):
    with open(os.path.join(demo_run, "validation.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [0, 2]  # before step 1 and after the last (--total_steps 2)
    for r in rows:
        assert r["val_num_problems"] == 16 and r["val_greedy_pass1"] * 16 == int(r["val_greedy_pass1"] * 16)
