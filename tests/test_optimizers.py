"""The optimisers' step: a loss or a gradient norm that is not finite stops the run with a message
naming it, before any weight changes; a finite step clips, steps and zeroes the gradients."""

from __future__ import annotations

import pytest
import torch

from oreal_fast.config import TrainConfig
from oreal_fast.model.decoder import Decoder, DecoderConfig, TokenRewardModel
from oreal_fast.optimizers import build_optimizers
from oreal_fast.rl_step import MicroStepSums
from oreal_fast.runtime import RLModels

CFG = TrainConfig(actor="tiny/model", datasets="none", actor_lr=1e-2, actor_min_lr=1e-3, token_level_rm_lr=1e-2,
                  token_level_rm_lr_min=1e-3, warmup_steps=0, rm_warmup_steps=0, total_steps=4)


def _models() -> RLModels:
    config = DecoderConfig(family="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                           num_heads=2, num_kv_heads=1, head_dim=8)
    torch.manual_seed(0)
    decoders = [Decoder(config, device="cpu", dtype=torch.float32, with_lm_head=i != 2) for i in range(3)]
    for d in decoders:
        d.init_weights()
    return RLModels(decoders[0], decoders[1].requires_grad_(False), TokenRewardModel(decoders[2]))


def _sums(actor_loss: float = 0.5, rm_loss: float = 0.7) -> MicroStepSums:
    values = dict(positive_loss=actor_loss, negative_loss=0.0, kl_penalty_loss=0.0, token_level_rm_loss=rm_loss,
                  adv_sum=0.0, neg_logprob_sum=0.0, ref_kl_sum=0.0, num_action_tokens=3.0,
                  rollout_logprob_abs_diff_sum=0.0, rollout_logprob_abs_diff_max=0.0, rollout_logprob_tokens=0.0)
    return MicroStepSums(**{k: torch.tensor(v) for k, v in values.items()})


def _with_grads(models: RLModels, actor_grad: float = 1.0) -> dict[str, torch.Tensor]:
    """Every trained parameter gets a gradient (the actor's filled with ``actor_grad``); -> weights before."""
    for p in models.actor.parameters():
        p.grad = torch.full_like(p, actor_grad)
    for p in models.token_rm.parameters():
        p.grad = torch.full_like(p, 0.1)
    return {f"{m}.{n}": p.detach().clone() for m in ("actor", "token_rm")
            for n, p in getattr(models, m).named_parameters()}


def _unchanged(models: RLModels, before: dict[str, torch.Tensor]) -> bool:
    now = {f"{m}.{n}": p for m in ("actor", "token_rm") for n, p in getattr(models, m).named_parameters()}
    return all(torch.equal(now[k], v) for k, v in before.items())


def test_a_finite_step_clips_steps_and_zeroes_the_gradients():
    models = _models()
    optimizers = build_optimizers(CFG, models, CFG.total_steps, torch.device("cpu"))
    before = _with_grads(models)
    actor_norm, rm_norm = optimizers.step(models, _sums(), update_actor=True, max_norm=1.0)
    num_actor = sum(p.numel() for p in models.actor.parameters())
    assert actor_norm == pytest.approx(num_actor ** 0.5, rel=1e-5) and rm_norm > 0
    assert not _unchanged(models, before)
    assert all(p.grad is None for p in models.actor.parameters())


@pytest.mark.parametrize("fault,match", [
    ("actor_loss", "the actor loss is not finite"),
    ("rm_loss", "the token-level RM loss is not finite"),
    ("actor_grad", "the actor's gradient norm is not finite"),
])
def test_what_is_not_finite_stops_the_run_before_any_weight_moves(fault, match):
    models = _models()
    optimizers = build_optimizers(CFG, models, CFG.total_steps, torch.device("cpu"))
    before = _with_grads(models, actor_grad=float("inf") if fault == "actor_grad" else 1.0)
    sums = _sums(actor_loss=float("nan") if fault == "actor_loss" else 0.5,
                 rm_loss=float("inf") if fault == "rm_loss" else 0.7)
    with pytest.raises(RuntimeError, match=f"{match} \\(NaN or inf\\) before the optimizer step"):
        optimizers.step(models, sums, update_actor=True, max_norm=1.0)
    assert _unchanged(models, before)


def test_a_frozen_actor_is_not_checked_or_stepped():
    models = _models()
    optimizers = build_optimizers(CFG, models, CFG.total_steps, torch.device("cpu"))
    before = _with_grads(models)
    actor_norm, _ = optimizers.step(models, _sums(actor_loss=float("nan")), update_actor=False, max_norm=1.0)
    assert actor_norm == 0.0
    assert all(torch.equal(p, before[f"actor.{n}"]) for n, p in models.actor.named_parameters())
