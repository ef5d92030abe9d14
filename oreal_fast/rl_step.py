"""The RL phase of one packed micro-batch: forwards, token-RM loss and weights, actor loss (4.9-4.11).

Order: reference log-probs (no grad), token-RM scores -> RM BCE -> RM backward -> token weights,
then the actor forward -> OREAL loss -> actor backward. The official order runs the actor first
(reference 10.3); the values and gradients are the same, and finishing the RM's graph before the
actor's keeps only one model's activations alive at a time.

Only the action positions (labels != -100) reach the LM head: their hidden rows are gathered first,
so prompt tokens cost no vocabulary-sized work. ``logprob_impl`` picks the fused kernel or its
eager twin (``oreal_fast.kernels.linear_logprob``); nothing else here depends on it.

Invariant: every returned value is a 0-d tensor on the model's device that SUMs over micro-batches
into the step's metric; nothing here syncs with the host.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import torch

from oreal_fast.algo import (
    LossCoefficients,
    Normalisers,
    actor_metric_sums,
    cumulative_means,
    oreal_actor_loss,
    rm_bce_loss,
    rm_token_weights,
    sequence_means,
)
from oreal_fast.config import TrainConfig
from oreal_fast.kernels import linear_logprob
from oreal_fast.model.decoder import Decoder, TokenRewardModel
from oreal_fast.trajectories import RLMicroBatch


@dataclass
class RLModels:
    """The three models of the RL phase; ``token_rm`` is None when the config has no RM."""

    actor: Decoder
    reference: Decoder
    token_rm: TokenRewardModel | None


@dataclass(frozen=True)
class Precision:
    """How forwards run: ``compute_dtype`` for matmuls (autocast on CUDA), fp32 masters elsewhere."""

    device: torch.device
    compute_dtype: torch.dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.device.type == "cuda" and self.compute_dtype != torch.float32:
            return torch.autocast("cuda", dtype=self.compute_dtype)
        return contextlib.nullcontext()


class MicroStepSums(NamedTuple):
    """0-d fp32 sums of one micro-batch (already divided by the step's global normalisers)."""

    positive_loss: torch.Tensor
    negative_loss: torch.Tensor
    kl_penalty_loss: torch.Tensor
    token_level_rm_loss: torch.Tensor
    adv_sum: torch.Tensor
    neg_logprob_sum: torch.Tensor
    ref_kl_sum: torch.Tensor
    num_action_tokens: torch.Tensor


def action_logprobs(
    model: Decoder, batch: RLMicroBatch, precision: Precision, impl: str
) -> torch.Tensor:
    """log pi(a_t) of every action token of the micro-batch, packed: ``[A]`` fp32.

    The LM head runs inside the model's forward (as ``head``), on the action rows only."""
    row, dtype = batch.row, precision.compute_dtype
    labels = batch.labels.index_select(0, batch.action_index)

    def head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        hidden = hidden.index_select(0, batch.action_index)  # (A, H)
        # the kernels (and their eager twin) pick their own precisions: autocast must not recast them
        with torch.autocast(precision.device.type, enabled=False):
            return linear_logprob(hidden.to(dtype), weight.to(dtype), labels, impl=impl)

    with precision.autocast():
        return model(row.input_ids, row.positions, row.cu_seqlens, row.max_seqlen, head=head)


def token_rm_step(
    token_rm: TokenRewardModel, batch: RLMicroBatch, norm: Normalisers, cfg: TrainConfig, precision: Precision
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RM forward, BCE loss share (backward done here) and the detached token weights (4.10).

    Returns:
        (rm_loss 0-d detached, w_pos [A] fp32, w_neg [A] fp32).
    """
    row = batch.row
    with precision.autocast():
        scores = token_rm(row.input_ids, row.positions, row.cu_seqlens, row.max_seqlen)  # (T,)
    scores = scores.float().index_select(0, batch.action_index)  # (A,)
    rm_loss = rm_bce_loss(sequence_means(scores, batch.action_cu_seqlens), batch.rewards, norm.num_seqs)
    rm_loss.backward()
    w_pos, w_neg = rm_token_weights(
        cumulative_means(scores.detach(), batch.action_cu_seqlens),
        batch.action_cu_seqlens,
        threshold_rescale=cfg.threshold_rescale,
        correct_threshold=cfg.correct_threshold,
        incorrect_threshold=cfg.incorrect_threshold,
        topk_rescale=cfg.topk_rescale,
        correct_topk_ratio=cfg.correct_topk_ratio,
        incorrect_topk_ratio=cfg.incorrect_topk_ratio,
    )
    return rm_loss.detach(), w_pos, w_neg


def rl_micro_step(
    models: RLModels,
    batch: RLMicroBatch,
    norm: Normalisers,
    cfg: TrainConfig,
    precision: Precision,
    *,
    update_actor: bool,
    logprob_impl: str,
) -> MicroStepSums:
    """One micro-batch of the RL phase; accumulates gradients into the actor (if ``update_actor``)
    and the token RM, and returns the micro-batch's metric sums."""
    with torch.no_grad():
        ref_lp = action_logprobs(models.reference, batch, precision, logprob_impl)
    if models.token_rm is not None:
        rm_loss, w_pos, w_neg = token_rm_step(models.token_rm, batch, norm, cfg, precision)
    else:
        rm_loss, w_pos, w_neg = ref_lp.new_zeros(()), None, None
    with torch.set_grad_enabled(update_actor):
        lp = action_logprobs(models.actor, batch, precision, logprob_impl)
        terms = oreal_actor_loss(
            lp,
            ref_lp,
            batch.advantages.index_select(0, batch.action_seq),
            (batch.rewards > 0).index_select(0, batch.action_seq),
            w_pos,
            w_neg,
            norm,
            LossCoefficients.from_config(cfg),
        )
    if update_actor:
        terms.loss.backward()
    metrics = actor_metric_sums(lp, ref_lp, batch.advantages)
    return MicroStepSums(
        terms.positive_loss,
        terms.negative_loss,
        terms.kl_penalty_loss,
        rm_loss,
        metrics.adv_sum,
        metrics.neg_logprob_sum,
        metrics.ref_kl_sum,
        metrics.num_tokens,
    )
