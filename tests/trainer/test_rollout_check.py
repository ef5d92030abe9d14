"""The step's rollout checks on CPU (fp32, tiny model): the |engine - trainer| log-prob of the kept
response tokens in the metrics (about 0 with either engine; clearly above 0, and equal to an
independent computation, when the engine's weight copy is perturbed), and the paged engine's KV
pool logged each step and resized from the measured step only after steps that trained the actor."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
import torch

from oreal_fast.config import load_config
from oreal_fast.parallel import full_weights
from oreal_fast.rollout.engine import PoolSizer
from oreal_fast.trainer import Trainer

from trainer_helpers import REWARDS, ScriptedRouter, write_config

KEYS = ("rollout_logprob_abs_diff_mean", "rollout_logprob_abs_diff_max")


class RecordingRollout:
    """Delegates to the trainer's engine and keeps each call's (prompt + response ids, log-probs)."""

    def __init__(self, engine) -> None:
        self.engine, self.samples = engine, {}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params, generator):
        out = self.engine.generate(prompts, params, generator)
        for prompt, response, lp in zip(prompts, out, self.engine.response_logprobs()):
            self.samples[tuple(prompt + response)] = lp
        return out


def _trainer(tmp_path, actor_dir, ref_dir, prompt_file, **extra) -> Trainer:
    return Trainer(load_config(write_config(tmp_path, actor_dir, ref_dir, prompt_file, **extra)),
                   router=ScriptedRouter(REWARDS))


@pytest.mark.parametrize("engine", ["plain", "paged"])
def test_fp32_engines_agree_with_the_trainer(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file, engine):
    metrics = _trainer(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file, rollout_engine=engine).step(0)
    assert metrics["num_kept"] == 2
    assert 0 <= metrics[KEYS[0]] <= metrics[KEYS[1]] < 1e-5


def test_a_perturbed_engine_shows_in_the_check(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file):
    """The engine's copy moved by 0.02 x N(0, 1) per weight: the metrics equal |engine - actor| over
    the kept response tokens, the actor's log-probs taken by transformers' Qwen2 in fp64."""
    from transformers import AutoModelForCausalLM

    trainer = _trainer(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file, rollout_engine="paged")
    g = torch.Generator().manual_seed(3)
    trainer.rollout.sync_weights((k, v + 0.02 * torch.randn(v.shape, generator=g))
                                 for k, v in full_weights(trainer.models.actor))
    trainer.rollout = RecordingRollout(trainer.rollout)
    metrics = trainer.step(0)

    actor = AutoModelForCausalLM.from_pretrained(perturbed_actor_dir, dtype=torch.float64)
    with open(os.path.join(trainer.run_dir, "trajectories", "step.0.jsonl")) as f:
        kept = [json.loads(line) for line in f]
    diffs = []
    for t in kept:
        labels = torch.tensor(t["labels"])
        act = labels != -100
        with torch.no_grad():
            lp = torch.log_softmax(actor(torch.tensor([t["input_ids"]])).logits[0], -1)[act]
        lp = lp.gather(1, labels[act][:, None])[:, 0]
        diffs.append((lp - trainer.rollout.samples[tuple(t["input_ids"])].double()).abs())
    diffs = torch.cat(diffs)
    assert metrics[KEYS[0]] > 1e-3  # far above the fp32 agreement of the unperturbed engine
    assert metrics[KEYS[0]] == pytest.approx(float(diffs.mean()), rel=1e-3)
    assert metrics[KEYS[1]] == pytest.approx(float(diffs.max()), rel=1e-3)


def test_a_scripted_rollout_has_no_check(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file):
    from trainer_helpers import TEXTS, ScriptedRollout, make_tokenizer

    tok = make_tokenizer()
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file))
    trainer = Trainer(cfg, rollout=ScriptedRollout(tok, TEXTS, tok.convert_tokens_to_ids("<|im_end|>")),
                      router=ScriptedRouter(REWARDS))
    metrics = trainer.step(0)
    assert metrics["num_kept"] == 2 and not any(k in metrics for k in KEYS)


@dataclass
class FakeMemory:
    limit: int

    def limit_bytes(self) -> int:
        return self.limit


@pytest.mark.parametrize("frozen", [False, True])
def test_the_pool_is_logged_and_resized_after_trained_steps_only(tmp_path, tiny_model_dir, perturbed_actor_dir,
                                                               prompt_file, frozen):
    """A limit far above the step's need: after a step that trained the actor the pool grows to the
    most the engine uses; a frozen actor's step leaves it as built."""
    trainer = _trainer(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file, rollout_engine="paged",
                       kv_cache_gib=8e-5, actor_freeze_steps=int(frozen))  # 20 of the 80 blocks it can use
    engine = trainer.rollout
    engine.sizer = PoolSizer(FakeMemory(1000 * 2**30))
    built, (_, largest) = engine.pool_bytes, engine.pool_bytes_range()
    assert built < largest
    metrics = trainer.step(0)
    assert metrics["rollout_kv_pool_gib"] == built / 2**30  # the pool this step generated with
    assert engine.pool_bytes == (built if frozen else largest)
