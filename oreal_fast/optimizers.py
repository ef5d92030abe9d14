"""The trained models' optimisers and LR schedules, built once per run, and the step that applies them.

AdamW with torch defaults and weight decay on every parameter, fused on CUDA (reference 1.2); the
official LR stepping (4.13): both schedules advance before any optimiser step, the frozen actor's
included (Q5). `Optimizers.step` clips and steps each trained model (4.12).

Invariant: no optimiser step applies a gradient unless the step's loss behind it and the gradient's
global norm are finite; the check runs on the device (``torch._assert_async``), never as a host
read, and stops the run with a message naming the model before its weights change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oreal_fast.algo import OfficialLRScheduler
from oreal_fast.config import TrainConfig
from oreal_fast.parallel import full_tensor
from oreal_fast.rl_step import MicroStepSums
from oreal_fast.runtime import RLModels


@dataclass
class Optimizers:
    """The actor's AdamW and LR schedule, and the token RM's (None without an RM)."""

    actor: torch.optim.Optimizer
    actor_scheduler: OfficialLRScheduler
    rm: torch.optim.Optimizer | None
    rm_scheduler: OfficialLRScheduler | None

    def all(self) -> list[torch.optim.Optimizer]:
        """Every optimiser (what their states will take sizes the rollout's memory)."""
        return [o for o in (self.actor, self.rm) if o is not None]

    def step_schedulers(self, step: int) -> tuple[float, float]:
        """Both LR schedules advance for 0-based ``step`` (4.13, Q5); -> (actor LR, RM LR or 0)."""
        actor_lr = self.actor_scheduler.step(step)
        rm_lr = self.rm_scheduler.step(step) if self.rm_scheduler is not None else 0.0
        return actor_lr, rm_lr

    def step(self, models: RLModels, sums: MicroStepSums | None, *, update_actor: bool,
             max_norm: float) -> tuple[float, float]:
        """Clip (pre-clip norms returned) and one AdamW step per trained model (4.12), once the
        losses and both gradient norms are known to be finite (`check_finite`).

        Args:
            sums: the step's loss sums over all micro-batches and ranks; None when no RL phase ran.
            update_actor: the actor is past its freeze and something was trained.

        Returns:
            (actor gradient norm, RM gradient norm), 0.0 for a model not stepped.
        """
        stepped = []  # (model, optimiser, what its messages call it)
        if update_actor:
            check_finite(sums.positive_loss + sums.negative_loss + sums.kl_penalty_loss, "the actor loss")
            stepped.append((models.actor, self.actor, "actor"))
        if models.token_rm is not None:
            check_finite(None if sums is None else sums.token_level_rm_loss, "the token-level RM loss")
            stepped.append((models.token_rm, self.rm, "token-level RM"))
        norms = {name: clip_gradients(model, max_norm, name) for model, _, name in stepped}
        for _, optimizer, _ in stepped:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return float(norms.get("actor", 0.0)), float(norms.get("token-level RM", 0.0))


def build_optimizers(cfg: TrainConfig, models: RLModels, total_steps: int, device: torch.device) -> Optimizers:
    """AdamW and the official schedule for the actor and the token RM (1.2, 4.13)."""
    fused = device.type == "cuda"
    actor = torch.optim.AdamW(models.actor.parameters(), lr=cfg.actor_lr, weight_decay=cfg.wd, fused=fused)
    actor_scheduler = OfficialLRScheduler(
        actor, peak_lr=cfg.actor_lr, min_lr=cfg.actor_min_lr, warmup_steps=cfg.warmup_steps,
        total_steps=total_steps, branch_warmup_steps=cfg.warmup_steps)
    if models.token_rm is None:
        return Optimizers(actor, actor_scheduler, None, None)
    rm = torch.optim.AdamW(models.token_rm.parameters(), lr=cfg.token_level_rm_lr, weight_decay=cfg.wd, fused=fused)
    rm_scheduler = OfficialLRScheduler(
        rm, peak_lr=cfg.token_level_rm_lr, min_lr=cfg.token_level_rm_lr_min, warmup_steps=cfg.rm_warmup_steps,
        total_steps=total_steps, branch_warmup_steps=cfg.warmup_steps)
    return Optimizers(actor, actor_scheduler, rm, rm_scheduler)


def check_finite(value: torch.Tensor | None, what: str) -> None:
    """Stops the run when ``value`` holds a NaN or an inf, before an optimiser step could apply it.

    On CPU the failed check raises ``RuntimeError`` with the message at once; on a GPU it is a
    device-side assert (no host sync) that ends the process at the next synchronisation.
    """
    if value is not None:
        torch._assert_async(torch.isfinite(value).all(), f"{what} is not finite (NaN or inf) before the optimizer "
                            "step; the weights are left as they were. Lower the learning rate or check the data")


def clip_gradients(model: torch.nn.Module, max_norm: float, name: str = "model") -> torch.Tensor:
    """Global L2 clip with coefficient min(1, max_norm / (norm + 1e-6)) (4.12); the pre-clip norm,
    0-d on the device, must be finite (``name`` names the model in the message).

    With FSDP2 the parameters are DTensor shards: the norm is over the whole model, as the clip
    coefficient needs, and comes back as a plain tensor.
    """
    norm = full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    check_finite(norm, f"the {name}'s gradient norm")
    return norm
