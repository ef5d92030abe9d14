"""``report_to`` through the trainer: a run with validation that crashes and is resumed sends wandb
(offline) exactly its jsonl rows and validation rows, at the trainer's steps, with its resolved config
under the run folder's name, and the resume continues the same wandb run."""

from __future__ import annotations

import json
import os

import pytest

from oreal_fast.config import load_config
from oreal_fast.trainer import Trainer

from tests.wandb_files import offline_runs, use_offline_wandb
from trainer_helpers import KeywordRouter, ScriptedRollout, make_tokenizer, write_config

TEXTS = ["yes, 2", "no", "yes it is 4", "not sure"]


def run(cfg, fail_at_call=None) -> str:
    tok = make_tokenizer()
    rollout = ScriptedRollout(tok, TEXTS, tok.convert_tokens_to_ids("<|im_end|>"), fail_at_call=fail_at_call)
    return Trainer(cfg, rollout=rollout, router=KeywordRouter()).fit()


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_wandb_gets_every_step_validation_and_the_config_and_a_resume_continues_its_run(
        tmp_path, tiny_model_dir, prompt_file, monkeypatch):
    use_offline_wandb(monkeypatch, str(tmp_path / "wandb-home"))
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, report_to="wandb",
                                   checkpoint_interval=1, val_datasets=prompt_file, val_interval=2,
                                   val_before_train=True, val_max_problems=4))
    # generate calls: validation 0, steps 1 and 2, validation after 2, then step 3 crashes
    with pytest.raises(RuntimeError, match="scripted crash"):
        run(cfg, fail_at_call=4)
    (run_dir,) = [os.path.join(tmp_path / "work", d) for d in os.listdir(tmp_path / "work")]
    resumed_cfg = load_config(cfg.config_path, {"resume": run_dir})
    assert run(resumed_cfg) == run_dir

    first, second = offline_runs(run_dir)
    assert first.run_id == second.run_id
    assert first.name == second.name == os.path.basename(run_dir)
    assert first.config == json.loads(json.dumps(cfg.to_dict()))  # every key
    assert second.config == json.loads(json.dumps(resumed_cfg.to_dict()))
    assert [r["step"] for r in first.history] == [0, 1, 2, 2]
    assert [r["step"] for r in second.history] == [3, 4, 4]  # no validation redone before step 3
    history = first.history + second.history
    assert [r for r in history if "val_time" not in r] == rows(os.path.join(run_dir, "rank0.log.jsonl"))
    assert [r for r in history if "val_time" in r] == rows(os.path.join(run_dir, "validation.jsonl"))
