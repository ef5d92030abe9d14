"""The OREAL actor objective on packed per-token tensors (reference 4.11) and its metrics.

    L = (alpha / N_pos) sum_{i: r_i > 0} A_i^[pos_mult_adv] sum_t w+_it (-l_it)
      - (beta / N_neg)  sum_{i: r_i <= 0} sum_t A_i w-_it exp(l_it - sg(l_it))
      + (kappa / N_act) sum_i sum_t k(l_it, lref_it)

with ``l`` the actor log-probs of the sampled tokens, ``lref`` the reference's, ``d = lref - l``
and ``k = exp(d) - d - 1`` (``unbias``, k3), ``d`` (``kl``) or ``d^2 / 2`` (``mse``). The
normalisers are the global counts of the step (``normalisers``), so the losses of all
micro-batches SUM to L; nothing is averaged here.

Where we differ from the official trainer: all products and sums are fp32 (fp64 for fp64 inputs,
``at_least_fp32``; the official code multiplies bf16 weights and log-probs, see 8.5-8.6), so the
KL gradient is not quantised to zero for |d| below bf16 resolution. The k3 value is computed as ``expm1(d) - d``
in fp64: it is about d^2 / 2, so ``exp(d) - d - 1`` in fp32 (error ~1e-7 from rounding exp(d)
near 1) loses every digit of the logged KL at |d| ~ 1e-4, right after the actor's freeze.
Invariant: the returned ``loss`` has the gradient ``oreal_logprob_grad`` w.r.t. ``logprobs``.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from oreal_fast.algo.normalisers import Normalisers, at_least_fp32, safe_denominator

KL_TYPES = ("unbias", "kl", "mse")


class ActorLossTerms(NamedTuple):
    """Actor loss of one micro-batch.

    Attributes:
        loss: 0-d fp32, positive + negative + KL, to ``backward()``.
        positive_loss, negative_loss, kl_penalty_loss: 0-d fp32, detached; each SUMs over
            micro-batches to the matching global term.
    """

    loss: torch.Tensor
    positive_loss: torch.Tensor
    negative_loss: torch.Tensor
    kl_penalty_loss: torch.Tensor


class ActorLossInputs(NamedTuple):
    """What the actor loss of one micro-batch needs besides the actor's log-probs, per action
    token (packed, ``A`` tokens), as one bundle for the loss, its gradient and the fused kernel.

    Attributes:
        ref_logprobs: ``[A]`` reference log-probs (no grad).
        advantages: ``[A]`` fp32, each token carries its sequence's A_i.
        is_positive: ``[A]`` bool, its sequence's reward > 0.
        w_pos, w_neg: ``[A]`` RM token weights, or None without a token RM (weight 1).
        norm: the step's global normalisers.
    """

    ref_logprobs: torch.Tensor
    advantages: torch.Tensor
    is_positive: torch.Tensor
    w_pos: torch.Tensor | None
    w_neg: torch.Tensor | None
    norm: Normalisers


def _check_kl_type(kl_type: str) -> None:
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type must be one of {KL_TYPES}, got {kl_type!r}")


@dataclass(frozen=True)
class LossCoefficients:
    """The constants of the actor objective, under the config's names (reference 2.1, 4.11)."""

    positive_loss_factor: float  # alpha, multiplier of the positive (BC) term
    negative_loss_factor: float  # beta, multiplier of the negative (PG) term
    kl_coef: float  # kappa, multiplier of the KL penalty
    kl_type: str  # "unbias" (k3) | "kl" | "mse", see kl_penalty
    pos_mult_adv: bool  # multiply the positive term by A_i

    def __post_init__(self) -> None:
        _check_kl_type(self.kl_type)

    @classmethod
    def from_config(cls, cfg: Any) -> "LossCoefficients":
        """The five fields of a ``TrainConfig`` (or anything with those attributes)."""
        return cls(cfg.positive_loss_factor, cfg.negative_loss_factor, cfg.kl_coef, cfg.kl_type,
                   cfg.pos_mult_adv)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL penalty ``k(d)``, ``d = lref - l`` (not yet scaled by kl_coef).

    Args:
        logprobs: ``[T]`` actor log-probs (gradient flows).
        ref_logprobs: ``[T]`` reference log-probs.
        kl_type: ``"unbias"`` (exp(d) - d - 1), ``"kl"`` (d) or ``"mse"`` (d^2 / 2).

    Returns:
        ``[T]`` fp32, within an fp32 rounding of the exact value for fp32 inputs (computed in
        fp64: ``d`` is exact there, and ``expm1(d) - d`` keeps the digits of k3 ~ d^2 / 2).
    """
    _check_kl_type(kl_type)
    d = ref_logprobs.double() - logprobs.double()
    if kl_type == "unbias":
        k = torch.expm1(d) - d
    elif kl_type == "kl":
        k = d
    else:
        k = d * d / 2
    return k.to(at_least_fp32(logprobs).dtype)


def kl_penalty_grad(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_type: str
) -> torch.Tensor:
    """``dk/dl`` per token: ``1 - exp(d)`` (unbias), ``-1`` (kl), ``-d`` (mse). ``[T]`` fp32.

    Unlike the k3 value, ``1 - exp(d)`` is first order in d, so its fp32 rounding (~1e-7
    absolute) is no larger than the rounding already in fp32 log-probs; the fused kernel
    forms the same expression.
    """
    _check_kl_type(kl_type)
    d = ref_logprobs.float() - logprobs.float()
    if kl_type == "unbias":
        return 1 - torch.exp(d)
    if kl_type == "kl":
        return torch.full_like(d, -1.0)
    return -d


def token_coefficients(inputs: ActorLossInputs, coefs: LossCoefficients
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token a+ (of -l) and a- (of the ratio), and the KL scale, normalisers folded in.

    Returns:
        ``(a_pos [T], a_neg [T], kl_scale 0-d)`` fp32: ``L = sum a+ (-l) - sum a- exp(l - sg l)
        + kl_scale * sum k(l, lref)``.
    """
    adv = inputs.advantages.float()
    pos = inputs.is_positive.float()
    w_pos = 1.0 if inputs.w_pos is None else inputs.w_pos.float()
    w_neg = 1.0 if inputs.w_neg is None else inputs.w_neg.float()
    pos_adv = adv if coefs.pos_mult_adv else 1.0
    norm = inputs.norm
    a_pos = coefs.positive_loss_factor / safe_denominator(norm.num_positive) * pos * pos_adv * w_pos
    a_neg = coefs.negative_loss_factor / safe_denominator(norm.num_negative) * (1 - pos) * adv * w_neg
    return a_pos, a_neg, coefs.kl_coef / safe_denominator(norm.num_action)


def oreal_actor_loss(logprobs: torch.Tensor, inputs: ActorLossInputs, coefs: LossCoefficients) -> ActorLossTerms:
    """OREAL actor loss of one micro-batch (module docstring formula).

    Normalisers: N_pos for the positive term, N_neg for the negative, N_act for the KL, all
    global over the step. The negative term's value is ``-(beta/N_neg) sum A w-`` (the ratio is
    1) and its gradient is ``-(beta/N_neg) A w-`` per token.

    Args:
        logprobs: ``[T]`` actor log-probs of the action tokens (with grad), packed.
        inputs: the other per-token inputs and the normalisers (``ActorLossInputs``).
        coefs: alpha, beta, kappa, the KL estimator and ``pos_mult_adv``.

    Returns:
        ``ActorLossTerms``.
    """
    lp = at_least_fp32(logprobs)
    a_pos, a_neg, kl_scale = token_coefficients(inputs, coefs)
    positive = (a_pos * -lp).sum()
    negative = -(a_neg * torch.exp(lp - lp.detach())).sum()
    kl = kl_scale * kl_penalty(lp, inputs.ref_logprobs, coefs.kl_type).sum()
    total = positive + negative + kl
    return ActorLossTerms(total, positive.detach(), negative.detach(), kl.detach())


def oreal_logprob_grad(logprobs: torch.Tensor, inputs: ActorLossInputs, coefs: LossCoefficients) -> torch.Tensor:
    """``g = dL/dl`` per token, in closed form (reference 4.11); the logits' gradient is then
    ``g_t (onehot(a_t) - softmax(z_t))``. Same arguments as ``oreal_actor_loss``.

    For unbias: ``g = -(alpha/N_pos) A^[pos_mult_adv] w+ [r>0] - (beta/N_neg) A w- [r<=0]
    + (kappa/N_act)(1 - exp(lref - l))``.

    Returns:
        ``[T]`` fp32, detached.
    """
    lp = logprobs.detach().float()
    a_pos, a_neg, kl_scale = token_coefficients(inputs, coefs)
    return -a_pos - a_neg + kl_scale * kl_penalty_grad(lp, inputs.ref_logprobs, coefs.kl_type)


class ActorMetricSums(NamedTuple):
    """Sums behind the official ``avg_adv``, ``avg_gen_entropy`` and ``avg_ref_kl``; add them
    over micro-batches (and ranks), then call ``actor_metrics``. 0-d fp32 tensors.

    Attributes:
        adv_sum: sum over sequences of A_i (once per sequence, not per token).
        neg_logprob_sum: sum over tokens of -l.
        ref_kl_sum: sum over tokens of l - lref.
        num_tokens: sum of R_i.
    """

    adv_sum: torch.Tensor
    neg_logprob_sum: torch.Tensor
    ref_kl_sum: torch.Tensor
    num_tokens: torch.Tensor


def actor_metric_sums(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, seq_advantages: torch.Tensor
) -> ActorMetricSums:
    """Metric sums of one micro-batch.

    Args:
        logprobs: ``[T]`` actor log-probs (detached here).
        ref_logprobs: ``[T]`` reference log-probs.
        seq_advantages: ``[M_mb]`` A_i, one per sequence.

    Returns:
        ``ActorMetricSums``.
    """
    lp = logprobs.detach().float()
    return ActorMetricSums(
        seq_advantages.float().sum(),
        -lp.sum(),
        (lp - ref_logprobs.float()).sum(),
        torch.full((), float(lp.numel()), device=lp.device),  # a fill, not a host-to-device copy
    )


def actor_metrics(sums: ActorMetricSums) -> dict[str, torch.Tensor]:
    """The official averages, each over ``num_tokens``:

    ``avg_adv`` = sum_i A_i / sum_i R_i (a per-sequence sum over a token count, as the
    official trainer logs it), ``avg_gen_entropy`` = mean -l (the sampled tokens' NLL, not the
    true entropy), ``avg_ref_kl`` = mean (l - lref) (k1).
    """
    n = safe_denominator(sums.num_tokens)
    return {
        "avg_adv": sums.adv_sum / n,
        "avg_gen_entropy": sums.neg_logprob_sum / n,
        "avg_ref_kl": sums.ref_kl_sum / n,
    }
