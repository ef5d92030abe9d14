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

from trainer_helpers import ScriptedRollout, make_tokenizer, write_config


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


def _bad_utf8_prompts(tmp_path, prompt_file):
    path = tmp_path / "latin1.jsonl"
    good = open(prompt_file, "rb").read().splitlines()[0]
    path.write_bytes(good + b"\n" + b'{"question": "caf\xe9?", "gold_answer": "1", "pass_rate": 0.25}\n')
    return {"datasets": str(path)}, [], f"data error: {path}:2: not valid UTF-8 (byte 0xe9 at column 18)"


def _bad_utf8_config(tmp_path, cfg):
    with open(cfg, "ab") as f:
        f.write(b"# caf\xe9\n")
    lineno = open(cfg, "rb").read().count(b"\n")
    return f"config error: config file {cfg}:{lineno}: not valid UTF-8 (byte 0xe9)"


@pytest.mark.parametrize("case", ["prompt file not UTF-8", "config file not UTF-8", "resume a folder without a state",
                                  "actor path missing", "cpu_offload"])
def test_bad_input_exits_2_with_one_line_and_leaves_no_run_folder(tmp_path, tiny_model_dir, prompt_file,
                                                                  capsys, case):
    from oreal_fast.train import main

    (tmp_path / "c").mkdir()
    extra, argv = {}, []
    if case == "prompt file not UTF-8":
        extra, argv, expected = _bad_utf8_prompts(tmp_path, prompt_file)
    if case == "cpu_offload":
        extra = {"cpu_offload": True}
    cfg = write_config(tmp_path / "c", tiny_model_dir, tiny_model_dir, extra.pop("datasets", prompt_file), **extra)
    if case == "config file not UTF-8":
        expected = _bad_utf8_config(tmp_path, cfg)
    elif case == "resume a folder without a state":
        (tmp_path / "some_run").mkdir()
        argv = ["--resume", str(tmp_path / "some_run")]
        expected = (f"config error: resume in {cfg}: {tmp_path / 'some_run'}: no resume state there (expected "
                    "resume/state-N.pt with its manifest state-N.json)")
    elif case == "actor path missing":
        argv = ["--actor", "/no/such/path"]
        expected = (f"config error: actor in {cfg} (set on the command line): the local path '/no/such/path' "
                    "does not exist")
    elif case == "cpu_offload":
        expected = (f"config error: cpu_offload in {cfg}: CPU offload (an FSDP feature of the official trainer) is not "
                    "implemented here; set it to False")
    with pytest.raises(SystemExit) as e:
        main([cfg, *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]
    assert not os.path.exists(tmp_path / "c" / "work")
    assert not os.path.exists(tmp_path / "some_run" / "run.lock")


@pytest.mark.parametrize("content", [None, "not json\n", '{"step": 1}\n'])
def test_plot_of_a_folder_without_a_metrics_file_exits_2_with_one_line(tmp_path, capsys, content):
    from oreal_fast.plot import main

    expected = {None: f"plot: {tmp_path}: no rank0.log.jsonl here or in a run folder below it",
                "not json\n": f"plot: {tmp_path}/rank0.log.jsonl:1: not valid JSON (Expecting value)",
                '{"step": 1}\n': f"plot: {tmp_path}/rank0.log.jsonl:1: no 'avg_judger_reward' (not a metrics row "
                                 "of oreal-fast)"}[content]
    if content is not None:
        (tmp_path / "rank0.log.jsonl").write_text(content)
    with pytest.raises(SystemExit) as e:
        main(str(tmp_path))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]
