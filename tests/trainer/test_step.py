"""One full RL step on a tiny random model with a scripted rollout and judger, checked against an
independent computation of reference 4.4-4.12 with transformers' own Qwen2 and plain torch."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from oreal_fast.config import load_config
from oreal_fast import runtime as runtime_module
from oreal_fast import trainer as trainer_module
from oreal_fast.trainer import Trainer

from trainer_helpers import (ALPHA, BETA, K, KL_COEF, REWARDS, TEXTS, ScriptedRollout, ScriptedRouter, make_tokenizer,
                             write_config)


def make_trainer(cfg, rewards=REWARDS) -> Trainer:
    tok = make_tokenizer()
    rollout = ScriptedRollout(tok, TEXTS, tok.convert_tokens_to_ids("<|im_end|>"))
    return Trainer(cfg, rollout=rollout, router=ScriptedRouter(rewards))


def independent_step(actor_dir, ref_dir, head, kept):
    """Reference 4.4-4.12 for the kept (input_ids, labels, reward) with HF Qwen2 and plain torch."""
    from transformers import AutoModelForCausalLM

    actor = AutoModelForCausalLM.from_pretrained(actor_dir, dtype=torch.float64)
    ref = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float64)
    rm = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float64)
    head = head.double().clone().requires_grad_(True)
    # RLOO in group 0 (c = 2 of 4): correct 1 - (0 - 1)/3 = 4/3, incorrect -1 - (0 + 1)/3 = -4/3
    adv = {1.0: 4 / 3, -1.0: -4 / 3}
    lens = [sum(l != -100 for l in t["labels"]) for t in kept]
    n_act, n_pos = sum(lens), sum(n for n, t in zip(lens, kept) if t["judger_reward"] > 0)
    n_neg, m = n_act - n_pos, len(kept)
    pos = neg = kl = rm_loss = adv_sum = nll = k1 = 0.0
    for t in kept:
        ids = torch.tensor([t["input_ids"]])
        labels = torch.tensor(t["labels"])
        act = labels != -100
        lp = torch.log_softmax(actor(ids).logits[0], -1)[act].gather(1, labels[act][:, None])[:, 0]
        with torch.no_grad():
            lref = torch.log_softmax(ref(ids).logits[0], -1)[act].gather(1, labels[act][:, None])[:, 0]
        s = (rm.model(ids).last_hidden_state[0] @ head.T)[:, 0][act]
        y = 1.0 if t["judger_reward"] > 0 else 0.0
        rm_loss = rm_loss + torch.nn.functional.binary_cross_entropy_with_logits(s.mean(), torch.tensor(y, dtype=s.dtype)) / m
        c = torch.cumsum(s.detach(), 0) / torch.arange(1, len(s) + 1)
        p = torch.sigmoid(c)
        w_pos, w_neg = ((p - 0.5) / 0.5).clamp(0, 1), (((1 - p) - 0.5) / 0.5).clamp(0, 1)
        a = adv[t["judger_reward"]]
        if t["judger_reward"] > 0:
            pos = pos + ALPHA / n_pos * a * (w_pos * -lp).sum()
        else:
            neg = neg - BETA / n_neg * (a * w_neg * torch.exp(lp - lp.detach())).sum()
        d = lref - lp
        kl = kl + KL_COEF / n_act * (torch.exp(d) - d - 1).sum()
        adv_sum += a
        nll += -lp.sum().item()
        k1 += (lp - lref).sum().item()
    (pos + neg + kl).backward()
    rm_loss.backward()
    norm = lambda ps: math.sqrt(sum(float((p.grad ** 2).sum()) for p in ps if p.grad is not None))
    return {
        "positive_loss": float(pos.detach()), "negative_loss": float(neg.detach()),
        "kl_penalty_loss": float(kl.detach()),
        "rl_loss": float((pos + neg + kl).detach()), "token_level_rm_loss": float(rm_loss.detach()),
        "avg_adv": adv_sum / n_act, "avg_gen_entropy": nll / n_act, "avg_ref_kl": k1 / n_act,
        "actor_grad_norm": norm(actor.parameters()),
        "token_rm_grad_norm": norm(list(rm.model.parameters()) + [head]),
    }


def test_full_step_metrics_equal_independent_computation(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file):
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file))
    trainer = make_trainer(cfg)
    head = torch.randn(1, 32, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        trainer.models.token_rm.score_head.weight.copy_(head)
    metrics = trainer.step(0)

    with open(os.path.join(trainer.run_dir, "trajectories", "step.0.jsonl")) as f:
        kept = [json.loads(line) for line in f]
    assert [t["judger_reward"] for t in kept] == [1.0, -1.0]  # one pair, correct first
    expected = independent_step(perturbed_actor_dir, tiny_model_dir, head, kept)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    assert metrics["avg_judger_reward"] == pytest.approx(sum(REWARDS) / len(REWARDS))
    assert metrics["actor_lr"] == pytest.approx(1e-3)  # warmup 1: step 0 is already at peak
    assert metrics["num_rl_tokens"] == sum(t["num_tokens"] for t in kept)
    assert metrics["kl_penalty_loss"] > 0 and metrics["negative_loss"] != 0


def test_frozen_actor_logs_zero_lr_and_norm_and_keeps_weights(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file):
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file, actor_freeze_steps=1))
    trainer = make_trainer(cfg)
    before = {k: v.clone() for k, v in trainer.models.actor.state_dict().items()}
    metrics = trainer.step(0)
    assert metrics["actor_lr"] == 0.0 and metrics["actor_grad_norm"] == 0.0
    assert metrics["token_rm_grad_norm"] > 0
    assert all(torch.equal(before[k], v) for k, v in trainer.models.actor.state_dict().items())


def test_empty_kept_set_skips_rl_phase_and_run_goes_on(tmp_path, tiny_model_dir, prompt_file):
    """Q8: every group all-correct or all-wrong -> warning, zero losses, schedulers advance."""
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, total_steps=3))
    trainer = make_trainer(cfg, rewards=[1.0] * K + [-1.0] * K)
    run_dir = trainer.fit()
    with open(os.path.join(run_dir, "rank0.log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["num_kept"] == 0 and r["rl_loss"] == 0.0 and r["token_level_rm_loss"] == 0.0 for r in rows)
    assert rows[2]["token_level_rm_lr"] < rows[1]["token_level_rm_lr"]  # cosine after the warmup
    with open(os.path.join(run_dir, "rank0.log")) as f:
        assert "no trajectory kept" in f.read()


def test_without_token_rm_weights_are_one_and_rm_metrics_zero(tmp_path, tiny_model_dir, perturbed_actor_dir,
                                                              prompt_file):
    """token_level_rm=None (the official wo-tokenrm config): no RM loss or optimizer, weights 1."""
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file,
                                   token_level_rm=None, threshold_rescale=False))
    trainer = make_trainer(cfg)
    assert trainer.models.token_rm is None
    metrics = trainer.step(0)
    assert metrics["token_level_rm_loss"] == 0.0 and metrics["token_level_rm_lr"] == 0.0
    assert metrics["token_rm_grad_norm"] == 0.0 and metrics["actor_grad_norm"] > 0
    # with weight 1 the kept pair's positive term is (alpha / N_pos) * A * sum(-l) > 0, and the
    # negative term -(beta / N_neg) * sum(A w-) = beta * 4/3 over the negative's tokens = 2/3
    assert metrics["positive_loss"] > 0
    assert metrics["negative_loss"] == pytest.approx(BETA * 4 / 3)


def test_shuffle_rewards_permutes_each_steps_rewards_before_the_advantages(tmp_path, tiny_model_dir, prompt_file,
                                                                           monkeypatch):
    """The no-signal control: the trajectories carry a permutation of the judged rewards, the same
    permutation for the same seed and step, and a different one at another step."""
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, filter_trajectory=False,
                                   total_steps=2, shuffle_rewards=True))
    trainer = make_trainer(cfg)
    seen = []
    real_select = trainer_module.select_trajectories

    def record(rewards, *args, **kwargs):
        seen.append(list(rewards))
        return real_select(rewards, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "select_trajectories", record)
    trainer.step(0)
    trainer.step(1)
    judged = REWARDS  # the scripted router's pattern, one per sample
    assert [sorted(r) for r in seen] == [sorted(judged)] * 2
    assert seen[0] != judged and seen[0] != seen[1]


def test_weights_cast_once_trains_bit_for_bit_as_autocast(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file,
                                                         monkeypatch):
    """``weights_cast_once`` (without its merged projections, which sum in another order) is a speed switch
    only: two steps under bf16 autocast, two micro-batches a
    step (one sequence each), give the same losses, gradient norms and trained weights, bit for bit
    (why bitwise: tests/test_cast_once.py). The config refuses bf16 on CPU (slow there); CPU autocast
    runs it, so the runtime's compute dtype is patched to bf16."""
    monkeypatch.setattr(runtime_module, "resolve_compute_dtype", lambda name, device: torch.bfloat16)
    keys = ("positive_loss", "negative_loss", "kl_penalty_loss", "rl_loss", "token_level_rm_loss", "avg_gen_entropy",
            "avg_ref_kl", "actor_grad_norm", "token_rm_grad_norm")
    runs = []
    for cast_once in (False, True):
        folder = tmp_path / f"cast_once_{cast_once}"
        folder.mkdir()
        cfg = load_config(write_config(folder, perturbed_actor_dir, tiny_model_dir, prompt_file, rl_mirco_batch=1,
                                       rl_micro_batch_tokens=0, weights_cast_once=cast_once,
                                       merged_projections=False))
        trainer = make_trainer(cfg)
        assert trainer.runtime.compute_dtype == torch.bfloat16
        metrics = [trainer.step(0), trainer.step(1)]
        weights = {**trainer.models.actor.state_dict(), **trainer.models.token_rm.state_dict()}
        runs.append(([[m[k] for k in keys] for m in metrics], weights))
    (ref_metrics, ref_weights), (metrics, weights) = runs
    assert metrics == ref_metrics
    assert all(0 < m[keys.index("actor_grad_norm")] for m in metrics)
    assert all(torch.equal(weights[k], w) for k, w in ref_weights.items())
