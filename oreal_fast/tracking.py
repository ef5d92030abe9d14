"""Experiment trackers: where a run's metrics go besides its own files (the ``report_to`` key).

Back-ends, one class each, built by :class:`Trackers` from the names in ``report_to``:
  ``tensorboard``  event files in ``tensorboard/`` of the run folder
  ``wandb``        Weights & Biases; its files in ``wandb/`` of the run folder (with ``WANDB_MODE=offline``
                   nothing leaves the machine and ``wandb sync`` uploads them later)
  ``trackio``      trackio's local database (``TRACKIO_DIR``, by default under ~/.cache/huggingface)
Each gets the run name (the run folder's name) and the resolved config (every key) at start, then
every step's and every validation's numeric metrics at the trainer's step (1 = after the first step,
validations at the steps trained before them, 0 = the initial actor). A resumed run continues the
same wandb run and trackio run: their identities are kept in ``trackers.json`` in the run folder.

What it does not do: write the run folder's jsonl and text logs (``metrics.MetricsWriter`` does,
and calls this), or import a tracker's package unless ``report_to`` names it.

Invariant: a tracker never stops training. A package that is not installed fails the config check
at start-up (:func:`check_report_to`); a tracker that raises later, at its start included, is warned
about once and gets nothing more, while the jsonl goes on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable
from typing import Any

TRACKERS = ("tensorboard", "wandb", "trackio")
# trackers whose package may be missing: each is installed by the extra of its name, oreal-fast[wandb]
OPTIONAL_TRACKERS = ("wandb", "trackio")
# the project the runs go to unless the tracker's usual variable (WANDB_PROJECT, TRACKIO_PROJECT) names one
DEFAULT_PROJECT = "oreal-fast"
STATE_FILE = "trackers.json"


def check_report_to(value: Any) -> list[str]:
    """Normalises ``report_to`` to a list of tracker names and checks that their packages are installed.

    Args:
        value: a tracker name or a list of them, from ``tensorboard``, ``wandb``, ``trackio``, or
            ``none`` alone (no tracker).

    Returns:
        The names as a list, ``["none"]`` for no tracker.

    Raises:
        ValueError: an unknown, repeated or misplaced name, or a package that is not installed (the
            message names the extra that installs it).
    """
    names = [value] if isinstance(value, str) else value
    allowed = ", ".join((*TRACKERS, "none"))
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"expected a tracker name or a non-empty list of them ({allowed}), got {value!r}")
    unknown = [n for n in names if n not in (*TRACKERS, "none")]
    if unknown:
        raise ValueError(f"unknown tracker(s) {unknown}; allowed: {allowed}")
    if len(set(names)) < len(names) or ("none" in names and len(names) > 1):
        raise ValueError(f"{list(names)!r} repeats a tracker or lists 'none' with others")
    for name in names:
        # find_spec looks for the package without importing it: a config check must not load wandb
        if name in OPTIONAL_TRACKERS and importlib.util.find_spec(name) is None:
            raise ValueError(f"{name!r} needs the {name} package, which is not installed: "
                             f"pip install 'oreal-fast[{name}]'")
    return list(names)


class TensorBoardTracker:
    """Scalars in ``<run_dir>/tensorboard``; the config as a text entry (the run folder names the run)."""

    def __init__(self, run_dir: str, run_name: str, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        # four spaces make it a code block in TensorBoard's Markdown text view
        text = json.dumps(config, indent=1, default=str).replace("\n", "\n    ")
        self._writer.add_text("config", "    " + text)

    def log(self, metrics: dict[str, float | int], step: int) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):  # TensorBoard's charts cannot draw NaN or inf
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()


class WandbTracker:
    """A Weights & Biases run whose files live in ``<run_dir>/wandb``; the mode (online, offline) is
    wandb's own setting (``WANDB_MODE``). Its id is kept in ``trackers.json`` so that a resumed run
    logs to the same wandb run."""

    def __init__(self, run_dir: str, run_name: str, config: dict[str, Any]) -> None:
        import wandb

        run_id = _load_state(run_dir).get("wandb")
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), name=run_name,
                               config=config, dir=run_dir, id=run_id, resume="allow" if run_id else None)
        _save_state(run_dir, "wandb", self._run.id)
        # wandb's own `_step` counts log calls (a validation is one more); every chart's x axis is the
        # trainer's step instead, which also stays right when a resume redoes steps wandb has seen
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def log(self, metrics: dict[str, float | int], step: int) -> None:
        self._run.log({"step": step, **metrics})

    def finish(self) -> None:
        self._run.finish()


class TrackioTracker:
    """A trackio run in trackio's local database; a resumed run continues the run of the same name in
    the project ``trackers.json`` recorded."""

    def __init__(self, run_dir: str, run_name: str, config: dict[str, Any]) -> None:
        import trackio

        project = _load_state(run_dir).get("trackio")
        resume = "never" if project is None else "allow"
        project = project or os.environ.get("TRACKIO_PROJECT", DEFAULT_PROJECT)
        self._run = trackio.init(project=project, name=run_name, config=config, resume=resume, embed=False)
        _save_state(run_dir, "trackio", project)

    def log(self, metrics: dict[str, float | int], step: int) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        self._run.finish()


_BACKENDS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "trackio": TrackioTracker}


class Trackers:
    """The trackers ``report_to`` names, fed together; one that raises is warned about once and dropped.

    Args:
        names: ``report_to`` as :func:`check_report_to` returns it (``["none"]``: no tracker).
        run_dir: the run folder; its name is the run's name in every tracker.
        config: the resolved config, every key (``TrainConfig.to_dict()``).
        warn: called with one line when a tracker fails.
    """

    def __init__(self, names: list[str], run_dir: str, config: dict[str, Any], warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._active: dict[str, Any] = {}
        run_name = os.path.basename(os.path.normpath(run_dir))
        for name in names:
            if name == "none":
                continue
            try:
                self._active[name] = _BACKENDS[name](run_dir, run_name, config)
            except Exception as e:  # any tracker error: training goes on without that tracker
                self._drop(name, "start", e)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Sends the numeric values of ``metrics`` (not ``step``, which is the x axis) at ``step``."""
        numbers = {k: v for k, v in metrics.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        for name, tracker in list(self._active.items()):
            try:
                tracker.log(numbers, step)
            except Exception as e:
                self._drop(name, f"step {step}", e)

    def close(self) -> None:
        """Finishes every tracker (wandb writes its last records, trackio its database)."""
        for name, tracker in list(self._active.items()):
            try:
                tracker.finish()
            except Exception as e:
                self._drop(name, "finish", e)
        self._active.clear()

    def _drop(self, name: str, when: str, error: Exception) -> None:
        # no finish() on a broken tracker: it may block on what broke it; wandb and trackio finish their
        # open run at the process's exit
        self._active.pop(name, None)
        self._warn(f"tracker {name} failed at {when} ({type(error).__name__}: {error}); it gets nothing more "
                   "in this run, the run folder's metrics files go on")


def _load_state(run_dir: str) -> dict[str, str]:
    path = os.path.join(run_dir, STATE_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _save_state(run_dir: str, tracker: str, identity: str) -> None:
    """Records ``identity`` (wandb's run id, trackio's project) for a resume; replaced atomically."""
    state = {**_load_state(run_dir), tracker: identity}
    path = os.path.join(run_dir, STATE_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(path + ".tmp", path)
