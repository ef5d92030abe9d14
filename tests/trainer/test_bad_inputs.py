"""Bad inputs end in their documented behaviour: a clear exit-2 message, or a counted, logged
failure that the run survives."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from oreal_fast.config import load_config
from oreal_fast.judge import Router
from oreal_fast.trainer import Trainer

from conftest import ScriptedRollout, make_tokenizer
from test_step import write_config


def test_empty_dataset_exits_2_with_a_message(tmp_path, tiny_model_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    (tmp_path / "c").mkdir()
    cfg = write_config(tmp_path / "c", tiny_model_dir, tiny_model_dir, str(empty))
    proc = subprocess.run([sys.executable, "-m", "oreal_fast.train", cfg], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "no prompt to train on" in proc.stderr and "Traceback" not in proc.stderr


def test_balancing_that_drops_everything_exits_2(tmp_path, tiny_model_dir, prompt_file):
    (tmp_path / "c").mkdir()
    cfg = write_config(tmp_path / "c", tiny_model_dir, tiny_model_dir, prompt_file,
                       data_difficulty_balance_cfg=[((0.5, 1.0), 2)])  # the file's pass rates are 0.25
    proc = subprocess.run([sys.executable, "-m", "oreal_fast.train", cfg], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "none left after difficulty balancing" in proc.stderr


@pytest.mark.parametrize("key", ["actor", "token_level_rm"])
def test_a_model_that_cannot_load_exits_2_naming_its_key(tmp_path, tiny_model_dir, prompt_file, key):
    refs = {"actor": tiny_model_dir, "token_level_rm": tiny_model_dir, key: str(tmp_path / "no_such_model.gguf")}
    (tmp_path / "c").mkdir()
    cfg = write_config(tmp_path / "c", refs["actor"], tiny_model_dir, prompt_file,
                       token_level_rm=refs["token_level_rm"])
    proc = subprocess.run([sys.executable, "-m", "oreal_fast.train", cfg], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{key} in {cfg}" in proc.stderr and "no_such_model.gguf" in proc.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def test_judger_failing_every_call_counts_failures_and_run_goes_on(tmp_path, tiny_model_dir, prompt_file):
    judgers = {"math_judger": {"hosts": [f"127.0.0.1:{closed_port()}"], "stop_word": "<|im_end|>",
                               "connect_timeout_s": 1, "read_timeout_s": 1, "max_retries": 1,
                               "retry_delay_s": 0.0}}
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file,
                                   total_steps=2, judgers_config=judgers))
    tok = make_tokenizer()
    rollout = ScriptedRollout(tok, ["I think 11", "maybe 13"], tok.convert_tokens_to_ids("<|im_end|>"))
    run_dir = Trainer(cfg, rollout=rollout, router=Router(cfg.judgers_config, cfg.data_judger_mapping)).fit()
    with open(os.path.join(run_dir, "rank0.log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # every sample went to the verifier, failed, and scored -1: nothing kept (Q8)
        assert r["judger_verifier_failures"] == 8 and r["avg_judger_reward"] == -1.0 and r["num_kept"] == 0
