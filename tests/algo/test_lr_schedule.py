import math
import warnings

import pytest
import torch

from oreal_fast.algo import OfficialLRScheduler, lr_at_step

# Official 7B config: warmup_steps = rm_warmup_steps = 10, total_steps = 90.
ACTOR = dict(peak_lr=5e-7, min_lr=1e-7, warmup_steps=10, total_steps=90, branch_warmup_steps=10)
RM = dict(peak_lr=2e-6, min_lr=4e-7, warmup_steps=10, total_steps=90, branch_warmup_steps=10)

# Reference table 10.2: step -> (actor lr, token-RM lr).
TABLE_10_2 = {
    0: (5.000000e-08, 2.000000e-07),
    1: (1.000000e-07, 4.000000e-07),
    2: (1.500000e-07, 6.000000e-07),
    5: (3.000000e-07, 1.200000e-06),
    8: (4.500000e-07, 1.800000e-06),
    9: (5.000000e-07, 2.000000e-06),
    10: (5.000000e-07, 2.000000e-06),
    11: (4.998458e-07, 1.999383e-06),
    12: (4.993835e-07, 1.997534e-06),
    20: (4.847759e-07, 1.939104e-06),
    30: (4.414214e-07, 1.765685e-06),
    40: (3.765367e-07, 1.506147e-06),
    50: (3.000000e-07, 1.200000e-06),
    60: (2.234633e-07, 8.938533e-07),
    70: (1.585786e-07, 6.343146e-07),
    80: (1.152241e-07, 4.608964e-07),
    89: (1.001542e-07, 4.006168e-07),
}


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _run(cfg: dict, steps: int = 90) -> tuple[list[float], torch.optim.Optimizer]:
    opt = _optimizer(cfg["peak_lr"])
    sched = OfficialLRScheduler(opt, **cfg)
    lrs = []
    for s in range(steps):
        lrs.append(sched.step(s))
        assert opt.param_groups[0]["lr"] == lrs[-1]
    return lrs, opt


@pytest.mark.parametrize("model,cfg", [(0, ACTOR), (1, RM)])
def test_scheduler_matches_table_10_2(model, cfg):
    lrs, _ = _run(cfg)
    for step, values in TABLE_10_2.items():
        assert lrs[step] == pytest.approx(values[model], rel=1e-6)


@pytest.mark.parametrize("model,cfg", [(0, ACTOR), (1, RM)])
def test_closed_form_matches_table_10_2(model, cfg):
    for step, values in TABLE_10_2.items():
        assert lr_at_step(step, **cfg) == pytest.approx(values[model], rel=1e-6)


def _independent_closed_form(step, peak, eta, w, total):
    if step <= w:
        return peak * min((step + 1) / w, 1.0)
    return eta + (peak - eta) * (1 + math.cos(math.pi * (step - w) / (total - w))) / 2


@pytest.mark.parametrize("cfg", [ACTOR, RM])
def test_scheduler_equals_closed_form_every_step(cfg):
    lrs, _ = _run(cfg)
    for step, lr in enumerate(lrs):
        want = _independent_closed_form(
            step, cfg["peak_lr"], cfg["min_lr"], cfg["warmup_steps"], 90
        )
        assert lr == pytest.approx(want, rel=1e-12)


def _torch_replay(cfg: dict, steps: int) -> list[float]:
    """The official construction and stepping with torch's own schedulers."""
    opt = _optimizer(cfg["peak_lr"])
    w = cfg["warmup_steps"]
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda x: x / w if x < w else 1)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=cfg["total_steps"] - w, eta_min=cfg["min_lr"]
    )
    lrs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for s in range(steps):
            (warm if s <= cfg["branch_warmup_steps"] else cos).step()
            lrs.append(opt.param_groups[0]["lr"])
    return lrs


@pytest.mark.parametrize(
    "cfg",
    [
        ACTOR,
        RM,
        dict(RM, warmup_steps=5),  # RM warmup shorter than the actor's branch rule
        dict(RM, warmup_steps=14, total_steps=30),  # longer: cosine starts below peak
        dict(ACTOR, warmup_steps=0, branch_warmup_steps=0, total_steps=20),
        # runs that end within the warmup never step the cosine (T_max <= 0 is never used)
        dict(ACTOR, total_steps=1),
        dict(RM, warmup_steps=12, total_steps=11),
    ],
)
def test_scheduler_replays_torch_schedulers(cfg):
    lrs, _ = _run(cfg, cfg["total_steps"])
    assert lrs == pytest.approx(_torch_replay(cfg, cfg["total_steps"]), rel=1e-13, abs=0)


def test_construction_sets_lr_zero():
    opt = _optimizer(5e-7)
    OfficialLRScheduler(opt, **ACTOR)
    assert opt.param_groups[0]["lr"] == 0.0


def test_resume_continues_identically():
    full, _ = _run(RM)
    opt = _optimizer(2e-6)
    sched = OfficialLRScheduler(opt, **RM)
    for s in range(15):
        sched.step(s)
    state = sched.state_dict()
    opt2 = _optimizer(2e-6)
    resumed = OfficialLRScheduler(opt2, **RM)
    resumed.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == full[14]
    assert [resumed.step(s) for s in range(15, 90)] == full[15:]


@pytest.mark.parametrize("w,total", [(90, 90), (-1, 90), (12, 12)])
def test_bad_schedule_raises(w, total):
    # (12, 12): the actor's branch (10) reaches the cosine at step 11, where this model's T_max is 0
    with pytest.raises(ValueError, match="warmup_steps"):
        OfficialLRScheduler(_optimizer(1e-6), **dict(ACTOR, warmup_steps=w, total_steps=total))


def test_a_one_step_run_within_the_warmup_takes_the_first_warmup_lr():
    lrs, _ = _run(ACTOR, 1)
    assert lrs == [5e-7 / 10]
    assert lr_at_step(0, **dict(ACTOR, total_steps=1)) == 5e-7 / 10
