"""Pure OREAL math: advantages, trajectory filter, normalisers, token-RM weights and loss,
the actor objective and the LR schedules. Tensors in, tensors out; no I/O, no host syncs in
the per-token functions."""

from oreal_fast.algo.advantages import compute_advantages, grpo_advantages, rloo_advantages
from oreal_fast.algo.filtering import (
    Selection,
    filter_one_pair,
    group_pass_rates,
    keep_all,
    select_trajectories,
)
from oreal_fast.algo.loss import (
    KL_TYPES,
    ActorLossInputs,
    ActorLossTerms,
    ActorMetricSums,
    LossCoefficients,
    actor_metric_sums,
    actor_metrics,
    kl_penalty,
    kl_penalty_grad,
    oreal_actor_loss,
    oreal_logprob_grad,
    token_coefficients,
)
from oreal_fast.algo.lr_schedule import OfficialLRScheduler, lr_at_step
from oreal_fast.algo.normalisers import Normalisers, at_least_fp32, global_normalisers, segment_ids
from oreal_fast.algo.token_rm import (
    cumulative_means,
    rm_bce_loss,
    rm_token_weights,
    sequence_means,
    threshold_weights,
    topk_weights,
)

__all__ = [
    "ActorLossInputs",
    "ActorLossTerms",
    "ActorMetricSums",
    "KL_TYPES",
    "LossCoefficients",
    "Normalisers",
    "OfficialLRScheduler",
    "Selection",
    "actor_metric_sums",
    "actor_metrics",
    "at_least_fp32",
    "compute_advantages",
    "cumulative_means",
    "filter_one_pair",
    "global_normalisers",
    "group_pass_rates",
    "grpo_advantages",
    "keep_all",
    "kl_penalty",
    "kl_penalty_grad",
    "lr_at_step",
    "oreal_actor_loss",
    "oreal_logprob_grad",
    "rloo_advantages",
    "rm_bce_loss",
    "rm_token_weights",
    "segment_ids",
    "select_trajectories",
    "sequence_means",
    "threshold_weights",
    "token_coefficients",
    "topk_weights",
]
