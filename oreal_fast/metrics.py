"""Step metrics and trajectory dumps, in the official trainer's formats (reference section 5).

Writes, under one run folder:
  ``rank0.log.jsonl``      one JSON object per step: the official keys of 5.1 in their order, then ours
  ``rank0.log``            a text line per ``log_interval`` steps
  ``validation.jsonl``     one JSON object per held-out validation: ``step`` (steps trained before
                           it, 0 = the initial actor), then the ``val_*`` metrics (also in the text
                           log and the trackers)
  ``validation_problems/step-{N}.jsonl``  the validation after N steps, one line per problem (its
                           question, gold answer, greedy response and verdict, correct samples), to
                           pair two validations and to read what was judged
  ``trajectories/step.{i}.jsonl`` and ``.log``  the kept trajectories of step i (5.2)
and sends every numeric metric of each step and validation to the trackers ``report_to`` names
(``tracking``: TensorBoard's ``tensorboard/`` by default, wandb, trackio).

It does not compute metrics (``step_record.step_metrics`` does); it writes a finished dict.
Invariant: the jsonl file only ever holds complete lines, and a resumed run first drops the lines
of steps it will redo.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oreal_fast.health import HEALTH_KEYS
from oreal_fast.tracking import Trackers

log = logging.getLogger("oreal_fast")

# The keys of the official rank0.log.jsonl, in order (reference 5.1).
OFFICIAL_KEYS = (
    "step",
    "actor_lr",
    "actor_grad_norm",
    "token_level_rm_lr",
    "token_rm_grad_norm",
    "avg_judger_reward",
    "avg_adv",
    "avg_gen_entropy",
    "avg_ref_kl",
    "positive_loss",
    "negative_loss",
    "kl_penalty_loss",
    "rl_loss",
    "token_level_rm_loss",
    "max_memory",
    "avg_new_tokens",
    "num_rl_tokens",
    "infer_tgs",
    "rl_tgs",
    "gen_time",
    "infer_time",
    "rl_time",
    "total_time",
    "eta",
)


def reproducible_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without what differs between any two runs of the same steps: wall-clock
    timings (``*_time``, ``*_time_s``, ``eta``), throughputs (``*_tgs``, ``*_per_s``), peak memory,
    the KV pool's size and the share of it used (``rollout_kv_pool_gib``, ``rollout_peak_kv_use``:
    the pool is sized from measured memory) and the process's health counters
    (``oreal_fast.health.HEALTH_KEYS``: memory now, open files, judge workers)."""
    varying = ("time", "tgs", "memory", "per_s", "kv_pool", "peak_kv_use")
    return {k: v for k, v in row.items()
            if k != "eta" and k not in HEALTH_KEYS and not any(part in k for part in varying)}


class MetricsWriter:
    """Appends one step's metrics to the jsonl and the text log, then sends them to the trackers.

    Args:
        run_dir: the run folder.
        log_interval: a text-log line every this many steps.
        report_to: the trackers (``config.report_to``, checked by ``tracking.check_report_to``).
        config: the resolved config, every key, for the trackers; None = an empty one.
    """

    def __init__(self, run_dir: str, *, log_interval: int = 1, report_to: Sequence[str] = ("tensorboard",),
                 config: dict[str, Any] | None = None) -> None:
        self.run_dir = run_dir
        self.log_interval = log_interval
        self.jsonl_path = os.path.join(run_dir, "rank0.log.jsonl")
        self.text_path = os.path.join(run_dir, "rank0.log")
        self.validation_path = os.path.join(run_dir, "validation.jsonl")
        self.validation_problems_dir = os.path.join(run_dir, "validation_problems")
        self._trackers = Trackers(list(report_to), run_dir, config or {}, warn=self._warn)

    def truncate_after(self, last_step: int) -> None:
        """Drops jsonl lines of steps > ``last_step`` (1-based), so a resumed run does not log twice;
        validations after more than ``last_step`` steps go too."""
        for path in (self.jsonl_path, self.validation_path):
            _truncate_jsonl(path, last_step)
        for path in glob.glob(os.path.join(self.validation_problems_dir, "step-*.jsonl")):
            if int(os.path.basename(path)[len("step-"):-len(".jsonl")]) > last_step:
                os.remove(path)

    def write(self, metrics: dict[str, Any], *, kl_coef: float, scheduler_actor_lr: float) -> None:
        """Writes one step. ``metrics`` must hold every official key; extra keys follow them."""
        missing = [k for k in OFFICIAL_KEYS if k not in metrics]
        if missing:
            raise KeyError(f"step metrics lack official keys {missing}")
        ordered = {k: metrics[k] for k in OFFICIAL_KEYS}
        ordered.update({k: v for k, v in metrics.items() if k not in ordered})
        with open(self.jsonl_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(ordered) + "\n")
            f.flush()
        step = ordered["step"]
        self._trackers.log(ordered, step)
        if step % self.log_interval == 0:
            # The official text line shows the scheduler LR even while the actor is frozen (5.1); we
            # show it too, and say that it was not applied (the jsonl has the applied 0).
            shown = {k: _fmt(v) for k, v in dict(ordered, actor_lr=scheduler_actor_lr, kl_coef=kl_coef).items()}
            if ordered["actor_lr"] != scheduler_actor_lr:
                shown["actor_lr"] += " (scheduler; actor frozen, not applied)"
            line = " ".join(f"{k}: {v}" for k, v in shown.items())
            with open(self.text_path, "a", encoding="utf-8") as f:
                f.write(f"[Step {step}] {line}\n")

    def write_validation(self, step: int, metrics: dict[str, float | int],
                         problems: Sequence[dict[str, Any]] = ()) -> None:
        """Writes one held-out validation after ``step`` steps (0 = before the first) to
        ``validation.jsonl``, the text log and the trackers, and its per-problem ``problems`` rows
        (when given) to ``validation_problems/step-{step}.jsonl``. These rows are not steps, so they
        never enter ``rank0.log.jsonl``, which keeps the official format."""
        if problems:
            os.makedirs(self.validation_problems_dir, exist_ok=True)
            # "w": a validation redone after a resume replaces the one it repeats
            with open(os.path.join(self.validation_problems_dir, f"step-{step}.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(p) + "\n" for p in problems)
        row = {"step": step, **metrics}
        with open(self.validation_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self._trackers.log(metrics, step)
        self.log_text(f"[Validation after step {step}] " + " ".join(f"{k}: {_fmt(v)}" for k, v in metrics.items()))

    def log_text(self, message: str) -> None:
        """Appends a free-form line (warnings, start-up facts) to the text log."""
        with open(self.text_path, "a", encoding="utf-8") as f:
            f.write(message.rstrip("\n") + "\n")

    def close(self) -> None:
        self._trackers.close()

    def _warn(self, message: str) -> None:
        log.warning(message)
        self.log_text(f"warning: {message}")


def _truncate_jsonl(path: str, last_step: int) -> None:
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= last_step]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(kept)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 and value != 0 else f"{value:.4f}"
    return str(value)


def trajectory_rows(kept: Iterable[Any], decode: Callable[..., str]) -> list[dict[str, Any]]:
    """The dump records of kept trajectories (``trajectories.Trajectory``): the decoded sequence
    (special tokens kept), token count, reward, advantage, input ids and labels."""
    return [
        {"sequence": decode(t.input_ids, skip_special_tokens=False), "num_tokens": t.num_tokens,
         "judger_reward": t.reward, "judger_advantage": t.advantage, "input_ids": t.input_ids, "labels": t.labels}
        for t in kept
    ]


def dump_trajectories(run_dir: str, step: int, records: Iterable[dict[str, Any]], *, debug: bool) -> None:
    """Writes ``trajectories/step.{step}.jsonl`` and ``.log`` for the kept trajectories (5.2).

    Each record holds ``sequence``, ``num_tokens``, ``judger_reward``, ``judger_advantage`` and,
    when ``debug``, ``input_ids`` and ``labels``.
    """
    folder = os.path.join(run_dir, "trajectories")
    os.makedirs(folder, exist_ok=True)
    keys = ("sequence", "num_tokens", "judger_reward", "judger_advantage")
    if debug:
        keys += ("input_ids", "labels")
    records = list(records)
    with open(os.path.join(folder, f"step.{step}.jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({k: r[k] for k in keys}, ensure_ascii=False) + "\n")
    with open(os.path.join(folder, f"step.{step}.log"), "w", encoding="utf-8") as f:
        for r in records:
            for k in keys:
                sep = "\n" if k == "sequence" else " "
                f.write(f"[{k}]:{sep}{r[k]}\n" + ("\n" if k == "sequence" else ""))
            f.write("\n\n" + "=" * 23 + "\n")


class SilentMetrics:
    """``MetricsWriter``'s interface, writing nothing: data-parallel ranks other than 0 (rank 0
    writes the step's metrics, which are already reduced over all ranks)."""

    def truncate_after(self, last_step: int) -> None:
        pass

    def write(self, metrics: dict[str, Any], *, kl_coef: float, scheduler_actor_lr: float) -> None:
        pass

    def write_validation(self, step: int, metrics: dict[str, float | int],
                         problems: Sequence[dict[str, Any]] = ()) -> None:
        pass

    def log_text(self, message: str) -> None:
        pass

    def close(self) -> None:
        pass
