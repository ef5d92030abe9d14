"""The official learning-rate schedules (reference 4.13), replayed exactly.

The official trainer gives each optimizer a LambdaLR warmup (f(x) = x/W if x < W else 1) and a
CosineAnnealingLR (T_max = total_steps - W, eta_min = min lr) that share the optimizer's LR. At
the start of every step it advances the warmup if ``step <= warmup_steps`` (the *actor's* W,
for the RM too) and the cosine otherwise; the cosine uses torch's recursive (chainable) update
starting from whatever LR the warmup left. ``OfficialLRScheduler`` replays those updates in
Python floats, so it matches the official values to the last bit and its state is two
counters and the current LR (independent of torch's scheduler internals across versions).
``lr_at_step`` is the closed form. Invariant: ``step(s)`` is called once per RL step, in order.
"""

import math

import torch


def _check(warmup_steps: int, total_steps: int, branch_warmup_steps: int) -> None:
    """The cosine phase (steps after ``branch_warmup_steps``) needs T_max = total - W > 0; a run that
    ends within the branch's warmup never steps it, whatever W is (as in the official trainer)."""
    reaches_cosine = branch_warmup_steps < total_steps - 1
    if warmup_steps < 0 or (reaches_cosine and total_steps - warmup_steps <= 0):
        raise ValueError(
            f"need 0 <= warmup_steps, and warmup_steps < total_steps once the cosine schedule is reached "
            f"(after step {branch_warmup_steps}); got warmup_steps={warmup_steps}, total_steps={total_steps}"
        )


def lr_at_step(
    step: int,
    *,
    peak_lr: float,
    min_lr: float,
    warmup_steps: int,
    total_steps: int,
    branch_warmup_steps: int,
) -> float:
    """Closed form of the official LR at 0-based ``step``.

    ``step <= Wb``: ``peak * min((step + 1) / W, 1)``; after:
    ``min + (lr_Wb - min)(1 + cos(pi (step - Wb) / (total - W))) / 2`` with ``lr_Wb`` the LR at
    step Wb (= peak unless W > Wb + 1). Valid while ``step - Wb <= total - W`` (always with
    W == Wb, the official configs).

    Args:
        step: 0-based RL step.
        peak_lr, min_lr: the model's peak and cosine floor.
        warmup_steps: W, this model's warmup length.
        total_steps: total RL steps.
        branch_warmup_steps: Wb, the actor's ``warmup_steps`` that selects the branch.
    """
    _check(warmup_steps, total_steps, branch_warmup_steps)

    def warm(s: int) -> float:
        return peak_lr * min((s + 1) / warmup_steps, 1.0) if warmup_steps > 0 else peak_lr

    if step <= branch_warmup_steps:
        return warm(step)
    epoch = step - branch_warmup_steps
    t_max = total_steps - warmup_steps
    cosine = (1 + math.cos(math.pi * epoch / t_max)) / 2
    return min_lr + (warm(branch_warmup_steps) - min_lr) * cosine


class OfficialLRScheduler:
    """One model's official schedule, writing ``param_group["lr"]`` of its optimizer.

    Construction sets the LR to the warmup's value at epoch 0 (0 when W > 0), as the official
    construction of both torch schedulers does.

    Args:
        optimizer: the model's optimizer (all param groups get the same LR).
        peak_lr, min_lr, warmup_steps, total_steps, branch_warmup_steps: as ``lr_at_step``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        peak_lr: float,
        min_lr: float,
        warmup_steps: int,
        total_steps: int,
        branch_warmup_steps: int,
    ) -> None:
        _check(warmup_steps, total_steps, branch_warmup_steps)
        self.optimizer = optimizer
        self.peak_lr = peak_lr
        self.min_lr = min_lr
        self.warmup_steps = warmup_steps
        self.t_max = total_steps - warmup_steps
        self.branch_warmup_steps = branch_warmup_steps
        self.warmup_epoch = 0
        self.cosine_epoch = 0
        self.lr = self._warmup_lr()
        self._apply()

    def _warmup_lr(self) -> float:
        # LambdaLR: base_lr * f(epoch), f(x) = x / W if x < W else 1.
        x = self.warmup_epoch
        return self.peak_lr * (x / self.warmup_steps if x < self.warmup_steps else 1)

    def _cosine_lr(self) -> float:
        # CosineAnnealingLR.get_lr, recursive form, from the current LR.
        e, t, eta = self.cosine_epoch, self.t_max, self.min_lr
        if (e - 1 - t) % (2 * t) == 0:
            return self.lr + (self.peak_lr - eta) * (1 - math.cos(math.pi / t)) / 2
        ratio = (1 + math.cos(math.pi * e / t)) / (1 + math.cos(math.pi * (e - 1) / t))
        return ratio * (self.lr - eta) + eta

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def step(self, step: int) -> float:
        """Advance for 0-based RL ``step`` (call before the step's optimizer step).

        Returns:
            The LR the optimizer uses during this step.
        """
        if step <= self.branch_warmup_steps:
            self.warmup_epoch += 1
            self.lr = self._warmup_lr()
        else:
            self.cosine_epoch += 1
            self.lr = self._cosine_lr()
        self._apply()
        return self.lr

    def state_dict(self) -> dict[str, float | int]:
        return {"warmup_epoch": self.warmup_epoch, "cosine_epoch": self.cosine_epoch, "lr": self.lr}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        """Restore the counters and the LR, and write the LR into the optimizer."""
        self.warmup_epoch = int(state["warmup_epoch"])
        self.cosine_epoch = int(state["cosine_epoch"])
        self.lr = float(state["lr"])
        self._apply()
