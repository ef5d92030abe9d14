"""The RL phase: global normalisers, then per packed micro-batch the forwards, token-RM loss and
weights and the actor loss (4.7-4.11); the optimiser steps (4.12) are ``optimizers``'.

Order: reference log-probs (no grad), token-RM scores -> RM BCE -> RM backward -> token weights,
then the actor forward -> OREAL loss -> actor backward. The official order runs the actor first
(reference 10.3); the values and gradients are the same, and finishing the RM's graph before the
actor's keeps only one model's activations alive at a time.

Only the action positions (labels != -100) reach the LM head: their hidden rows are gathered inside
the model's forward (the ``head`` argument), so prompt tokens cost no vocabulary-sized work and the
head runs where a parameter-gathering wrapper (FSDP2) sees it; the LM-head kernels cast the head's
inputs to the autocast dtype themselves. ``RLSettings`` holds everything the micro-step needs of
the config, built once per run: the loss constants, the RM weight rule, the precision
(``runtime.Precision``), which LM-head kernel computes the actor loss (``linear_logprob`` + the
eager loss, or ``fused_oreal_loss``, each with ``impl`` "triton" or "eager"), and whether the
phase runs on weights cast to the compute dtype once (``cast_once``) instead of in every forward.

Data parallel: ``rl_phase`` trains this rank's share of the kept list and returns sums over all
ranks (``oreal_fast.parallel``); the losses are divided by global counts, so summed gradients are
the 1-process gradients.

The rollout check: where a micro-batch carries the engine's log-prob of each action token, the
step sums |actor log-prob - engine log-prob| and keeps its maximum; the actor's log-probs are the
ones the loss already computes (same weights as generation: the rollout syncs after each
optimiser step), so the check costs no forward.

Invariant: every returned value is a 0-d tensor on the model's device that SUMs over micro-batches
(and ranks) into the step's metric, but ``rollout_logprob_abs_diff_max``, which takes the MAX;
nothing here syncs with the host.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, NamedTuple

import torch

from oreal_fast.algo import (
    ActorLossInputs,
    LossCoefficients,
    Normalisers,
    actor_metric_sums,
    at_least_fp32,
    cumulative_means,
    global_normalisers,
    oreal_actor_loss,
    rm_bce_loss,
    rm_token_weights,
    sequence_means,
)
from oreal_fast.cast_once import weights_cast_once
from oreal_fast.kernels import fused_oreal_loss, linear_logprob
from oreal_fast.model.decoder import Decoder, TokenRewardModel
from oreal_fast.parallel import DataParallel, max_over_ranks, sum_over_ranks
from oreal_fast.progress import Progress
from oreal_fast.runtime import Precision, RLModels, resolve_kernel_impl
from oreal_fast.trajectories import (RLMicroBatch, Trajectory, iter_micro_batches, make_micro_batches,
                                     plan_micro_batches)

LOSS_KERNELS = ("linear_logprob", "fused_oreal_loss")


@dataclass(frozen=True)
class TokenWeightRule:
    """The RM token-weight mapping of the config (reference 4.10): threshold or top-k rescale."""

    threshold_rescale: bool
    correct_threshold: float
    incorrect_threshold: float
    topk_rescale: bool
    correct_topk_ratio: float
    incorrect_topk_ratio: float

    @classmethod
    def from_config(cls, cfg: Any) -> "TokenWeightRule":
        return cls(cfg.threshold_rescale, cfg.correct_threshold, cfg.incorrect_threshold,
                   cfg.topk_rescale, cfg.correct_topk_ratio, cfg.incorrect_topk_ratio)

    def weights(self, cum_means: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_pos [A], w_neg [A]) fp32 from the RM's cumulative mean scores."""
        return rm_token_weights(cum_means, cu_seqlens, **self.__dict__)


@dataclass(frozen=True)
class RLSettings:
    """What one micro-step needs, built once per run (not read from the config per micro-batch).

    ``impl`` is the kernels' own word ("triton" | "eager"); ``loss_kernel`` one of LOSS_KERNELS;
    ``weights_cast_once``: `rl_phase` runs under ``cast_once.weights_cast_once`` (without data
    parallelism, and only where the forwards run under autocast); ``merged_projections``: with
    q/k/v and gate/up merged there (its ``merge``).
    """

    coefficients: LossCoefficients
    token_weights: TokenWeightRule
    precision: Precision
    impl: str
    loss_kernel: str = "linear_logprob"
    weights_cast_once: bool = False
    merged_projections: bool = False

    def __post_init__(self) -> None:
        if self.loss_kernel not in LOSS_KERNELS:
            raise ValueError(f"RLSettings.loss_kernel {self.loss_kernel!r}: expected one of {LOSS_KERNELS}")
        if self.merged_projections and not self.weights_cast_once:
            raise ValueError("RLSettings.merged_projections needs weights_cast_once (it merges the copies that makes)")

    @classmethod
    def from_config(cls, cfg: Any, precision: Precision) -> "RLSettings":
        """What every micro-step needs of the config, built once per run."""
        return cls(LossCoefficients.from_config(cfg), TokenWeightRule.from_config(cfg), precision,
                   impl=resolve_kernel_impl(cfg.loss_impl, precision.device), loss_kernel=cfg.loss_kernel,
                   weights_cast_once=cfg.weights_cast_once,
                   merged_projections=cfg.merged_projections and cfg.weights_cast_once)

    def weight_casts(self, models: RLModels, dp: DataParallel) -> contextlib.AbstractContextManager:
        """The trained models' weights cast once for a phase (``cast_once``) when asked for and useful:
        forwards under autocast, no data parallelism (FSDP2 already gathers in the compute dtype)."""
        if not (self.weights_cast_once and self.precision.uses_autocast and not dp.enabled):
            return contextlib.nullcontext()
        trained = [m for m in (models.actor, models.token_rm) if m is not None]
        return weights_cast_once(trained, self.precision.compute_dtype, merge=self.merged_projections)


class MicroStepSums(NamedTuple):
    """0-d fp32 sums of one micro-batch (the losses already divided by the step's global
    normalisers), and the rollout check over its action tokens that have engine log-probs."""

    positive_loss: torch.Tensor
    negative_loss: torch.Tensor
    kl_penalty_loss: torch.Tensor
    token_level_rm_loss: torch.Tensor
    adv_sum: torch.Tensor
    neg_logprob_sum: torch.Tensor
    ref_kl_sum: torch.Tensor
    num_action_tokens: torch.Tensor
    rollout_logprob_abs_diff_sum: torch.Tensor
    rollout_logprob_abs_diff_max: torch.Tensor  # the one field that combines by MAX
    rollout_logprob_tokens: torch.Tensor

    def merged(self, other: "MicroStepSums") -> "MicroStepSums":
        """Both micro-batches' values: sums added, the maximum the larger."""
        both = {name: a + b for name, a, b in zip(self._fields, self, other)}
        both["rollout_logprob_abs_diff_max"] = torch.maximum(self.rollout_logprob_abs_diff_max,
                                                             other.rollout_logprob_abs_diff_max)
        return MicroStepSums(**both)

    def over_ranks(self, dp: DataParallel) -> "MicroStepSums":
        """Every rank's values combined (one SUM and one MAX collective)."""
        summed = MicroStepSums(*sum_over_ranks(dp, list(self)))
        (top,) = max_over_ranks(dp, [self.rollout_logprob_abs_diff_max])
        return summed._replace(rollout_logprob_abs_diff_max=top)


def rollout_logprob_check(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor | None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """|trainer - engine| log-prob over a micro-batch's action tokens.

    Args:
        logprobs: [A] the actor's log-probs (detached here).
        rollout_logprobs: [A] fp32 the engine's, or None (a scripted engine): all three are then 0.

    Returns:
        (sum, max, count) 0-d fp32.
    """
    lp = logprobs.detach().float()
    if rollout_logprobs is None:
        zero = lp.new_zeros(())
        return zero, zero, zero
    diff = (lp - rollout_logprobs).abs()
    return diff.sum(), diff.max(), torch.full((), float(diff.numel()), device=lp.device)


def _forward(model: Decoder | TokenRewardModel, batch: RLMicroBatch, **kwargs):
    """``model``'s forward over the micro-batch's packed row, with the row's host bounds: the attention
    backends that split the row per sequence read those, not ``cu_seqlens`` (a sync in every layer)."""
    row = batch.row
    return model(row.input_ids, row.positions, row.cu_seqlens, row.max_seqlen, cu_seqlens_host=row.cu_seqlens_host,
                 **kwargs)


def _action_head(batch: RLMicroBatch, lm_head):
    """A ``Decoder.forward`` head: gathers the action rows and applies ``lm_head`` (an LM-head
    kernel, which casts to the autocast dtype itself)."""

    def head(hidden: torch.Tensor, weight: torch.Tensor):
        return lm_head(hidden.index_select(0, batch.action_index), weight)  # (A, H) rows

    return head


def action_logprobs(model: Decoder, batch: RLMicroBatch, settings: RLSettings) -> torch.Tensor:
    """log pi(a_t) of every action token of the micro-batch, packed: ``[A]`` fp32."""
    labels = batch.action_labels
    head = _action_head(batch, lambda h, w: linear_logprob(h, w, labels, impl=settings.impl))
    with settings.precision.autocast():
        return _forward(model, batch, head=head)


def token_rm_step(
    token_rm: TokenRewardModel, batch: RLMicroBatch, norm: Normalisers, settings: RLSettings, scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RM forward, BCE loss share (backward done here, of ``scale`` x the loss) and the detached
    token weights (4.10).

    Returns:
        (rm_loss 0-d detached, w_pos [A] fp32, w_neg [A] fp32).
    """
    with settings.precision.autocast():
        scores = _forward(token_rm, batch)  # (T,)
    scores = at_least_fp32(scores).index_select(0, batch.action_index)  # (A,)
    rm_loss = scale * rm_bce_loss(sequence_means(scores, batch.action_cu_seqlens), batch.rewards, norm.num_seqs)
    rm_loss.backward()
    w_pos, w_neg = settings.token_weights.weights(cumulative_means(scores.detach(), batch.action_cu_seqlens),
                                                  batch.action_cu_seqlens)
    return rm_loss.detach(), w_pos, w_neg


def actor_loss(
    actor: Decoder, batch: RLMicroBatch, ref_lp: torch.Tensor, w_pos: torch.Tensor | None,
    w_neg: torch.Tensor | None, norm: Normalisers, settings: RLSettings,
):
    """Actor forward and the OREAL loss terms (4.11) with the configured kernel; -> (terms, logprobs [A])."""
    advantages = batch.advantages.index_select(0, batch.action_seq)  # (A,)
    is_positive = (batch.rewards > 0).index_select(0, batch.action_seq)  # (A,)
    inputs = ActorLossInputs(ref_lp, advantages, is_positive, w_pos, w_neg, norm)
    labels, coefs = batch.action_labels, settings.coefficients
    if settings.loss_kernel == "fused_oreal_loss":
        head = _action_head(batch, lambda h, w: fused_oreal_loss(h, w, labels, inputs, coefs, impl=settings.impl))
        with settings.precision.autocast():
            return _forward(actor, batch, head=head)
    lp = action_logprobs(actor, batch, settings)
    return oreal_actor_loss(lp, inputs, coefs), lp


def rl_micro_step(
    models: RLModels, batch: RLMicroBatch, norm: Normalisers, settings: RLSettings, *, update_actor: bool,
    pad: bool = False,
) -> MicroStepSums:
    """One micro-batch of the RL phase; accumulates gradients into the actor (if ``update_actor``)
    and the token RM, and returns the micro-batch's metric sums.

    ``pad``: a data-parallel padding micro-batch. It runs every forward and backward, so the ranks'
    FSDP collectives stay in step, with its losses multiplied by 0: it adds exactly zero to every
    gradient and to every returned sum.
    """
    scale = 0.0 if pad else 1.0
    with torch.no_grad():
        ref_lp = action_logprobs(models.reference, batch, settings)
    if models.token_rm is not None:
        rm_loss, w_pos, w_neg = token_rm_step(models.token_rm, batch, norm, settings, scale)
    else:
        rm_loss, w_pos, w_neg = ref_lp.new_zeros(()), None, None
    with torch.set_grad_enabled(update_actor):
        terms, lp = actor_loss(models.actor, batch, ref_lp, w_pos, w_neg, norm, settings)
    if update_actor:
        (scale * terms.loss).backward()
    metrics = actor_metric_sums(lp, ref_lp, batch.advantages)
    sums = MicroStepSums(
        terms.positive_loss,
        terms.negative_loss,
        terms.kl_penalty_loss,
        rm_loss,
        metrics.adv_sum,
        metrics.neg_logprob_sum,
        metrics.ref_kl_sum,
        metrics.num_tokens,
        *rollout_logprob_check(lp, batch.rollout_logprobs),
    )
    return MicroStepSums(*(torch.zeros_like(v) for v in sums)) if pad else sums


def rl_phase(
    models: RLModels, kept: list[Trajectory], settings: RLSettings, *, micro_batch_size: int,
    token_budget: int, update_actor: bool, dp: DataParallel = DataParallel(), progress: Progress | None = None,
) -> MicroStepSums:
    """Global normalisers, then every micro-batch of this rank's share in kept order with gradient
    accumulation (4.7-4.11).

    With data parallelism every rank holds the whole kept list: the normalisers count all of it,
    the rank trains its contiguous share (``DataParallel.share``, no trajectory twice: Q3), and a
    rank with fewer micro-batches than the busiest one runs zero-weight padding micro-batches
    (``rl_micro_step(pad=True)``) so that every rank makes the same FSDP collectives. Every rank
    plans all ranks' micro-batches once, from host lengths every rank knows, so this needs no
    collective of its own. With ``settings.weights_cast_once`` (one process) every micro-batch runs
    on the copies ``cast_once.weights_cast_once`` makes when the phase starts.

    Args:
        kept: the step's kept trajectories (at least one), the same list on every rank.
        micro_batch_size, token_budget: the split (``trajectories.plan_micro_batches``).
        progress: told this rank's micro-batch count, then each micro-batch and its tokens once its
            work is queued (on a GPU the host runs about one micro-batch ahead).

    Returns:
        The step's sums over all micro-batches of all ranks (0-d device tensors; the rollout
        check's maximum over them).
    """
    device = settings.precision.device
    lens = torch.tensor([t.num_actions for t in kept]).to(device, non_blocking=True)
    rewards = torch.tensor([t.reward for t in kept]).to(device, non_blocking=True)
    norm = global_normalisers(lens, rewards)
    plans = [plan_micro_batches([t.num_tokens for t in share], micro_batch_size, token_budget)
             for share in (DataParallel(r, dp.world_size).share(kept) for r in range(dp.world_size))]
    num_pad = max(len(plan) for plan in plans) - len(plans[dp.rank])
    pads = make_micro_batches(kept[:1], [range(1)], device) * num_pad if num_pad else []
    share = dp.share(kept)
    tokens = [sum(share[i].num_tokens for i in group) for group in plans[dp.rank]]
    progress = progress or Progress()
    progress.expect(len(tokens) + num_pad, "micro-batches")
    # packed one at a time, each while the GPU still runs the one before (iter_micro_batches)
    micro_batches = iter_micro_batches(share, plans[dp.rank], device)
    work = chain(zip(micro_batches, repeat(False), tokens), ((m, True, 0) for m in pads))
    total = None
    with settings.weight_casts(models, dp):
        for micro, pad, num_tokens in work:
            sums = rl_micro_step(models, micro, norm, settings, update_actor=update_actor, pad=pad)
            total = sums if total is None else total.merged(sums)
            progress.add(done=1, tokens=num_tokens)
    return total.over_ranks(dp)
