"""Kill-and-resume: a run that crashes after its step-2 checkpoint and is resumed logs the same
steps 3-4 as a run that never stopped (same seed, CPU, deterministic)."""

from __future__ import annotations

import json
import os

import pytest

from oreal_fast.checkpoint import find_resume_state
from oreal_fast.config import load_config
from oreal_fast.trainer import Trainer

from conftest import KeywordRouter, ScriptedRollout, make_tokenizer, reproducible
from test_step import write_config

TEXTS = ["yes, 2", "no", "yes it is 4", "not sure", "the answer is no", "yes!"]
def run(cfg, fail_at_call=None) -> str:
    tok = make_tokenizer()
    rollout = ScriptedRollout(tok, TEXTS, tok.convert_tokens_to_ids("<|im_end|>"), fail_at_call=fail_at_call)
    trainer = Trainer(cfg, rollout=rollout, router=KeywordRouter())
    return trainer.fit()


def rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "rank0.log.jsonl")) as f:
        return [reproducible(json.loads(line)) for line in f]


def test_resumed_run_matches_uninterrupted_run(tmp_path, tiny_model_dir, prompt_file):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    straight = load_config(write_config(tmp_path / "a", tiny_model_dir, tiny_model_dir, prompt_file,
                                        actor_freeze_steps=1))
    expected = rows(run(straight))
    assert len(expected) == 4 and any(r["num_kept"] > 0 for r in expected[2:])

    cfg_path = write_config(tmp_path / "b", tiny_model_dir, tiny_model_dir, prompt_file, actor_freeze_steps=1)
    with pytest.raises(RuntimeError, match="scripted crash"):
        run(load_config(cfg_path), fail_at_call=2)  # dies generating step 3, after the hf-2 checkpoint
    work_dir = str(tmp_path / "b" / "work")
    state = find_resume_state("auto", work_dir)
    assert state is not None and state.endswith("state-2.pt")

    resumed_dir = run(load_config(cfg_path, {"resume": "auto"}))
    assert rows(resumed_dir) == expected
    assert sorted(d for d in os.listdir(resumed_dir) if d.startswith("hf-")) == ["hf-2", "hf-4"]
