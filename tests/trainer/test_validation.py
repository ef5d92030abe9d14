"""Validation inside the step loop and ``python -m oreal_fast.eval`` on a tiny random model: greedy
through the trainer's rollout, the training stream untouched, bad held-out data stopping before
step 1, and the eval command on a run's saved checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from statistics import NormalDist

import datasets
import pytest
import torch

from oreal_fast.config import load_config
from oreal_fast.eval import main as eval_main
from oreal_fast.metrics import reproducible_metrics
from oreal_fast.trainer import Trainer

from trainer_helpers import KeywordRouter, ScriptedRollout, make_tokenizer, write_config

TEXTS = ["yes, 2", "no idea", "yes!", "maybe 7"]


class LoggingRollout(ScriptedRollout):
    """ScriptedRollout that logs (num_prompts, do_sample, generator) of every call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = []

    def generate(self, prompts, params, generator):
        self.log.append((len(prompts), params.do_sample, generator))
        return super().generate(prompts, params, generator)


def run(cfg, texts=TEXTS) -> tuple[Trainer, LoggingRollout, str]:
    tok = make_tokenizer()
    rollout = LoggingRollout(tok, texts, tok.convert_tokens_to_ids("<|im_end|>"))
    trainer = Trainer(cfg, rollout=rollout, router=KeywordRouter("yes"))
    return trainer, rollout, trainer.fit()


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_validation_goes_through_the_trainer_rollout_greedy_then_sampled(tmp_path, tiny_model_dir, prompt_file):
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, total_steps=3,
                                   val_datasets=prompt_file, val_interval=2, val_before_train=True,
                                   val_samples_per_problem=2, val_max_problems=6))
    # every response says yes: all greedy answers are judged correct
    trainer, rollout, run_dir = run(cfg, texts=["yes"])
    training = (8, True, trainer.sampling_generator)
    validation = [(6, False), (12, True)]
    calls = [(n, s) if g is not trainer.sampling_generator else "train" for n, s, g in rollout.log]
    assert calls == [*validation, "train", "train", *validation, "train", *validation]
    assert all(c == training for c in rollout.log if c[2] is trainer.sampling_generator)
    val = rows(os.path.join(run_dir, "validation.jsonl"))
    assert [r["step"] for r in val] == [0, 2, 3]  # before step 1, every 2 steps, after the last
    # 6 of 6 greedy: Wilson's lower bound 6 / (6 + z^2); every sample right: no spread over problems
    wilson_low = 6 / (6 + NormalDist().inv_cdf(0.975) ** 2)
    assert all(r == {"step": r["step"], "val_num_problems": 6, "val_greedy_pass1": 1.0, "val_sampled_pass1": 1.0,
                     "val_pass_at_k": 1.0, "val_greedy_pass1_low": pytest.approx(wilson_low),
                     "val_greedy_pass1_high": 1.0, "val_sampled_pass1_low": 1.0, "val_sampled_pass1_high": 1.0,
                     "val_pass_at_k_low": 1.0, "val_pass_at_k_high": 1.0, "val_time": r["val_time"]}
               and r["val_time"] > 0 for r in val)
    # each validation's problems, in the held-out file's order, to pair two validations
    for step in (0, 2, 3):
        assert rows(os.path.join(run_dir, "validation_problems", f"step-{step}.jsonl")) == [
            {"question": f"What is {a} + {a}?", "greedy_correct": True, "num_correct": 2, "num_samples": 2,
             "gold_answer": str(2 * a), "greedy_response": "yes<|im_end|>"}
            for a in range(1, 7)]
    assert [r["step"] for r in rows(os.path.join(run_dir, "rank0.log.jsonl"))] == [1, 2, 3]
    with open(os.path.join(run_dir, "rank0.log")) as f:
        assert "[Validation after step 3] val_num_problems: 6 val_greedy_pass1: 1.0000" in f.read()


def test_validation_on_trains_exactly_as_validation_off(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file):
    def train(name, **val):
        (tmp_path / name).mkdir()
        cfg = load_config(write_config(tmp_path / name, perturbed_actor_dir, tiny_model_dir, prompt_file,
                                       total_steps=3, **val))
        trainer, _, run_dir = run(cfg)
        return trainer, rows(os.path.join(run_dir, "rank0.log.jsonl")), run_dir

    off, off_rows, _ = train("off")
    on, on_rows, on_dir = train("on", val_datasets=prompt_file, val_interval=1, val_before_train=True,
                                val_samples_per_problem=3)
    assert len(rows(os.path.join(on_dir, "validation.jsonl"))) == 4
    assert any(r["num_kept"] for r in off_rows)  # the actor did train
    assert [reproducible_metrics(r) for r in on_rows] == [reproducible_metrics(r) for r in off_rows]
    for key, value in off.models.actor.state_dict().items():
        assert torch.equal(on.models.actor.state_dict()[key], value), key


def test_bad_held_out_data_exits_2_before_the_first_step(tmp_path, tiny_model_dir, prompt_file):
    bad = tmp_path / "val.jsonl"
    bad.write_text('{"question": "What is 1 + 1?", "gold_answer": "2", "pass_rate": 0.5}\n{"question": 3}\n')
    (tmp_path / "c").mkdir()
    cfg = write_config(tmp_path / "c", tiny_model_dir, tiny_model_dir, prompt_file, val_datasets=str(bad))
    proc = subprocess.run([sys.executable, "-m", "oreal_fast.train", cfg], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"data error: {bad}:2: field 'question' must be a string, got int 3"
    assert not list((tmp_path / "c" / "work").glob("*/rank0.log.jsonl"))  # no step ran


def test_eval_command_on_a_saved_checkpoint_writes_its_report(tmp_path, tiny_model_dir, prompt_file, capsys):
    cfg_path = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, total_steps=2,
                            val_datasets=prompt_file)
    _, _, run_dir = run(load_config(cfg_path))
    out = tmp_path / "results.json"
    eval_main([os.path.join(run_dir, "hf-2"), "--config", cfg_path, "--k", "2", "--max_problems", "3",
               "--gen_max_new", "6", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["model"] == os.path.join(run_dir, "hf-2") and report["samples_per_problem"] == 2
    assert [p["question"] for p in report["problems"]] == [f"What is {a} + {a}?" for a in (1, 2, 3)]
    # a random model writes 6 bytes of noise: never the stop word, so every verdict is wrong
    assert report["metrics"] == {"val_num_problems": 3, "val_greedy_pass1": 0.0, "val_sampled_pass1": 0.0,
                                 "val_pass_at_k": 0.0}
    printed, errors = capsys.readouterr()
    printed = printed.splitlines()
    # the last progress line: 3 greedy + 3 x 2 sampled responses of 6 tokens each (no stop word)
    assert errors.splitlines()[-1].startswith("evaluate 9/9 responses, 54 tokens, ")
    # 0 of 3 greedy: Wilson's upper bound z^2 / (3 + z^2) = 3.84 / 6.84; no sampled answer right: no spread
    assert printed[-4:] == ["| greedy pass@1 | 0.0 | [0.0, 56.1] |", "| mean@2 | 0.0 | [0.0, 0.0] |",
                            "| pass@2 | 0.0 | [0.0, 0.0] |", f"wrote {out}"]


def test_eval_preset_on_a_local_copy_writes_its_report_beside_the_model(tmp_path, tiny_model_dir):
    model = shutil.copytree(tiny_model_dir, tmp_path / "policy")
    rows = [{"question": f"Sam has {a} bags of 1,000 beads. How many beads?", "answer": f"#### {a},000"}
            for a in (2, 3, 4)]
    data = tmp_path / "test-00000-of-00001.parquet"  # GSM8K's own file name and fields
    datasets.Dataset.from_list(rows).to_parquet(str(data))
    eval_main([str(model), "--preset", "gsm8k", "--datasets", str(data), "--k", "2", "--gen_max_new", "6",
               "--gen_max_length", "128"])
    report = json.loads((model / "eval_gsm8k.json").read_text())
    assert [p["gold_answer"] for p in report["problems"]] == ["2000", "3000", "4000"]
    assert (report["preset"], report["samples_per_problem"]) == ("gsm8k", 2)
    # the preset's temperature and top-p; the flags' lengths
    assert report["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 0, "max_new_tokens": 6,
                                  "max_length": 128, "seed": 0}
    assert report["metrics"]["val_pass_at_k"] == 0.0  # a random model's 6 bytes never hold the stop word
    assert list(report["estimates"]) == ["greedy pass@1", "mean@2", "pass@2"]


def test_eval_command_with_a_bad_model_exits_2_in_one_line(tmp_path, prompt_file, capsys):
    missing = str(tmp_path / "no_such_model.gguf")
    with pytest.raises(SystemExit) as e:
        eval_main([missing, "--datasets", prompt_file, "--out", str(tmp_path / "r.json")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"config error: actor in oreal_fast.eval (set on the command line): the local path {missing!r} does not exist"]
    assert not (tmp_path / "r.json").exists()


def test_eval_command_without_a_config_judges_with_a_rule_only_judger(tmp_path, tiny_model_dir, prompt_file):
    out = tmp_path / "r.json"
    eval_main([tiny_model_dir, "--datasets", prompt_file, "--gen_max_new", "6", "--gen_max_length", "64",
               "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["config"] == "oreal_fast.eval" and report["samples_per_problem"] == 0
    assert report["metrics"] == {"val_num_problems": 8, "val_greedy_pass1": 0.0}
    assert all(len(p["greedy_response"]) > 0 and not p["greedy_correct"] for p in report["problems"])
