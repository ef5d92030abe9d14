"""A run's state on disk: which run a start continues, what it restores, what it saves, whether the disk
holds it, and what is on disk when the run stops early.

`CheckpointManager.open` runs before anything loads: it checks ``work_dir`` and, on ``--resume``,
locks the run folder, removes what interrupted writes left, chooses the newest resume state that
verifies and loads it (a state that does not verify or load is a config error naming it). Once the
trainer has built the stateful objects (`TrainState`: models, optimisers and LR schedules, prompt
sampler, sampling generator), `attach` hands them over and restores them (a new ``total_steps``
replays the official LR stepping), `check_disk` refuses a start whose checkpoints the filesystem
cannot hold, `open_run_folder` makes a fresh run's folder on rank 0 and `save_config` writes the
resolved config into it (a resume writes its own beside the first). During the run `save`
writes ``hf-N`` and the resume state; after a stop `save_after_stop` and `on_disk` say what a resume
starts from.

Not here: the file formats and atomic writes (``checkpoint``), the folder and its lock
(``run_dir``), when to save (the trainer). Invariant: a fresh run's folder is created only after
every part has loaded and the disk check has passed, so a start that fails leaves nothing behind;
resume states are written by one process only (``check_data_parallel``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from oreal_fast import checkpoint as ckpt
from oreal_fast.config import ConfigError, TrainConfig
from oreal_fast.data.sampler import PromptSampler
from oreal_fast.oom import StepOutOfMemory
from oreal_fast.optimizers import Optimizers
from oreal_fast.parallel import DataParallel, broadcast_from_main, full_state_dict
from oreal_fast.rollout.base import RolloutEngine
from oreal_fast.run_dir import (
    CheckpointWriteError,
    RunFolder,
    RunFolderError,
    check_work_dir,
    free_bytes,
    nearest_existing,
)
from oreal_fast.runtime import RLModels


@dataclass
class TrainState:
    """The stateful objects a resume state holds."""

    models: RLModels
    optimizers: Optimizers
    sampler: PromptSampler
    sampling_generator: torch.Generator
    rollout: RolloutEngine | None = None  # built after the restore (`attach_rollout`)


def check_data_parallel(cfg: TrainConfig, dp: DataParallel) -> None:
    """What a run of several processes cannot do yet is a config error before anything loads."""
    if not dp.enabled:
        return
    where = f"in {cfg.config_path} with {dp.world_size} processes (torchrun)"
    if cfg.keep_resume_states:
        raise ConfigError(f"keep_resume_states {where}: resume states are written by one process only; "
                          "set --keep_resume_states 0 (the hf-N folders are still written)")
    if cfg.resume:
        raise ConfigError(f"resume {where}: a run resumes in one process only")


@contextlib.contextmanager
def _named_in_config(cfg: TrainConfig) -> Iterator[None]:
    """A run-folder error becomes a config error naming its key and the config file."""
    try:
        yield
    except RunFolderError as e:
        raise ConfigError(f"{e.key} in {cfg.config_path}: {e}") from None


class CheckpointManager:
    """The run folder and its checkpoints; see the module docstring for the order of the calls.

    Attributes:
        notes: start-up lines for the run's text log (what a resume found and did).
        run_dir: the run folder, once `open_run_folder` has run.
        start_step: the first step to run (0, or the restored state's next step).
    """

    def __init__(self, cfg: TrainConfig, dp: DataParallel) -> None:
        self.cfg, self.dp = cfg, dp
        self.notes: list[str] = []
        self.run: RunFolder | None = None
        self.run_dir: str | None = None
        self.start_step = 0
        self._resume_path: str | None = None  # the resume state this start continues from
        self._loaded: dict[str, Any] | None = None  # its contents, until `attach` restores them
        self._state_on_disk: str | None = None  # the newest resume state this run may resume from
        self._saved = 0  # steps covered by the newest checkpoint written
        self._fresh = False
        self._state: TrainState | None = None
        self._tokenizer: Any = None
        self.total_steps = 0

    @classmethod
    def open(cls, cfg: TrainConfig, dp: DataParallel) -> CheckpointManager:
        """Checks ``work_dir``; on ``--resume`` locks the run, verifies and loads its newest good state."""
        check_data_parallel(cfg, dp)
        manager = cls(cfg, dp)
        with _named_in_config(cfg):
            check_work_dir(cfg.work_dir)
            if cfg.resume:
                manager._open_resume()
        return manager

    @property
    def resumed(self) -> bool:
        """This start continues a run from one of its resume states."""
        return self._resume_path is not None

    def _open_resume(self) -> None:
        cfg = self.cfg
        run_dir = ckpt.resume_run_dir(cfg.resume, cfg.work_dir)
        if run_dir is None:
            self.notes.append(f"no resume state under {cfg.work_dir}; starting a new run")
            return
        if not ckpt.state_steps(run_dir):  # checked before locking: never put a lock file into a stranger's folder
            raise ConfigError(f"resume in {cfg.config_path}: {run_dir}: no resume state there (expected "
                              f"{ckpt.RESUME_DIR}/state-N.pt with its manifest state-N.json)")
        self.run = RunFolder.reopen(run_dir)
        freed = self.run.remove_partial_writes()
        if freed:
            self.notes.append(freed)
        try:
            choice = ckpt.choose_resume_state(cfg.resume, run_dir)
        except ckpt.NoResumeState as e:
            self.run.close()
            raise ConfigError(f"resume in {cfg.config_path}: {e}") from None
        if choice.damaged:
            self.notes.append(choice.fallback_note())
            for step, _ in choice.damaged:
                ckpt.remove_state(run_dir, step)
        self._loaded = self._load(choice.path)
        self._resume_path = self._state_on_disk = choice.path

    def _load(self, path: str) -> dict[str, Any]:
        try:
            return ckpt.load_resume_state(path)
        except Exception as e:  # verified bytes that still do not unpickle: another version wrote them
            raise ConfigError(f"resume in {self.cfg.config_path}: {path} verifies but cannot be loaded "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None

    # ----------------------------------------------------------------------------- start

    def attach(self, state: TrainState, tokenizer: Any, total_steps: int) -> int:
        """Takes the run's stateful objects (and the tokenizer the HF folders carry), restores the
        loaded resume state into them; returns the first step to run."""
        self._state, self._tokenizer, self.total_steps = state, tokenizer, total_steps
        self._rollout_memory: dict[str, int] = {}
        if self._loaded is not None:
            self._restore(self._loaded, self._resume_path)
            self._loaded = None  # its tensors now live in the objects
        self._saved = self.start_step
        return self.start_step

    def attach_rollout(self, rollout: RolloutEngine) -> None:
        """Takes the rollout engine, built after the restore, and gives it the memory state the
        resume state holds; from now on resume states carry its state."""
        self._state.rollout = rollout
        rollout.load_memory_state(self._rollout_memory)

    def _restore(self, saved: dict[str, Any], path: str) -> None:
        """Loads a resume state; a state that does not fit this config is a config error naming it."""
        s = self._state
        try:
            s.models.actor.load_state_dict(saved["actor"])
            if s.models.token_rm is not None:
                s.models.token_rm.load_state_dict(saved["token_rm"])
                s.optimizers.rm.load_state_dict(saved["rm_optimizer"])
            s.optimizers.actor.load_state_dict(saved["actor_optimizer"])
            s.sampler.load_state_dict(saved["sampler"])
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise ConfigError(f"resume in {self.cfg.config_path}: {path} does not fit this config "
                              f"({type(e).__name__}: {str(e).splitlines()[0]})") from None
        s.sampling_generator.set_state(saved["sampling_generator"])
        self._rollout_memory = saved.get("rollout_memory", {})  # states from before it have none
        ckpt.set_rng_state(saved["rng"])
        self.start_step = saved["next_step"]
        self.notes.append(f"resumed from {path} at step {self.start_step + 1}")
        self._restore_schedules(saved)

    def _restore_schedules(self, saved: dict[str, Any]) -> None:
        """The saved LR schedules; for a new total the official stepping replayed for the steps done,
        so the LRs from here on are those of a run planned with the new total from the start."""
        opt = self._state.optimizers
        schedulers = [(opt.actor_scheduler, saved["actor_scheduler"]), (opt.rm_scheduler, saved["rm_scheduler"])]
        schedulers = [(sched, state) for sched, state in schedulers if sched is not None]
        saved_total = saved["total_steps"]
        if saved_total == self.total_steps:
            for scheduler, state in schedulers:
                scheduler.load_state_dict(state)
            return
        for scheduler, _ in schedulers:
            for s in range(self.start_step):
                scheduler.step(s)
        self.notes.append(f"total_steps is {self.total_steps}, the saved run planned {saved_total}: LR schedules "
                          f"recomputed for {self.total_steps} steps (actor LR after step {self.start_step}: "
                          f"{opt.actor_scheduler.lr:.4g})")

    def check_disk(self) -> None:
        """The filesystem holds one more HF folder and the kept resume states, or the run does not start."""
        cfg, models = self.cfg, self._state.models
        trained = [m for m in (models.actor, models.token_rm) if m is not None]
        hf, state = ckpt.checkpoint_bytes(models.actor, trained)
        saves = sum(1 for done in range(self.start_step + 1, self.total_steps + 1) if self.due(done))
        kept = min(cfg.keep_resume_states, saves)
        on_disk = 0 if self.run is None else ckpt.states_bytes(self.run.path)
        need = hf + max(0, kept * state - on_disk) if saves else 0
        where = self.run.path if self.run is not None else cfg.work_dir
        detail = f"HF folder {ckpt.size_text(hf)} + {kept} resume state(s) x {ckpt.size_text(state)}"
        detail += f", {ckpt.size_text(on_disk)} on disk" if on_disk else ""
        free = free_bytes(where)
        if free < need:
            raise ConfigError(f"work_dir in {cfg.config_path}: a checkpoint needs {ckpt.size_text(need)} ({detail}) "
                              f"but {nearest_existing(where)} has {ckpt.size_text(free)} free; free some space, "
                              "pick another work_dir or lower keep_resume_states")

    def open_run_folder(self) -> str:
        """The run folder on every rank: the resumed one, or a fresh one rank 0 creates now."""
        if self.dp.is_main and self.run is None:
            with _named_in_config(self.cfg):
                self.run = RunFolder.create(self.cfg.work_dir)
            self._fresh = True
        self.run_dir = broadcast_from_main(self.dp, self.run.path if self.dp.is_main else None)
        return self.run_dir

    def save_config(self, text: str) -> str:
        """Writes the run's resolved config ``text`` (a config file) into the run folder on rank 0;
        returns its path.

        A fresh run writes ``config.py``. A resumed run leaves that file as it is and writes
        ``config.resume-N.py`` beside it (N = steps done when it resumed), so each invocation's
        settings stay on disk; a later resume from the same state replaces that file on purpose,
        since it redoes every step the invocation it describes ran.
        """
        name = f"config.resume-{self.start_step}.py" if self.resumed else "config.py"
        path = os.path.join(self.run_dir, name)
        if self.dp.is_main:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return path

    @contextlib.contextmanager
    def first_writes(self) -> Iterator[None]:
        """Removes a fresh run folder again when what runs inside fails (a failed start leaves nothing)."""
        try:
            yield
        except BaseException:
            if self._fresh:
                self.run.remove()
            raise

    # ----------------------------------------------------------------------------- during the run

    def due(self, done: int) -> bool:
        """Whether a checkpoint is due after ``done`` finished steps (every ``checkpoint_interval``, and the last)."""
        return done % self.cfg.checkpoint_every() == 0 or done == self.total_steps

    def save(self, step: int, *, hf_folder: bool = True) -> None:
        """``hf-{step}`` (the official actor folder, bf16) and the resume state beside it (unless
        ``keep_resume_states`` is 0). Raises CheckpointWriteError; partial files are gone then."""
        actor = self._state.models.actor
        if hf_folder:
            # FSDP2: every rank gathers the shards, rank 0 writes
            weights = full_state_dict(actor) if self.dp.enabled else None
            folder = os.path.join(self.run_dir, ckpt.hf_folder_name(step + 1, self.total_steps))
            if self.dp.is_main:
                ckpt.save_hf_folder(folder, actor, self._tokenizer, weights)
        if self.cfg.keep_resume_states > 0:  # always 0 under dp > 1 (check_data_parallel)
            self._state_on_disk = ckpt.save_resume_state(self.run_dir, step + 1, self._state_dict(step),
                                                         self.cfg.keep_resume_states)
        self._saved = step + 1

    def _state_dict(self, step: int) -> dict[str, Any]:
        s = self._state
        models, opt = s.models, s.optimizers
        return {
            "next_step": step + 1,
            "total_steps": self.total_steps,
            "config": self.cfg.to_dict(),
            "actor": models.actor.state_dict(),
            "token_rm": models.token_rm.state_dict() if models.token_rm is not None else None,
            "actor_optimizer": opt.actor.state_dict(),
            "rm_optimizer": opt.rm.state_dict() if opt.rm is not None else None,
            "actor_scheduler": opt.actor_scheduler.state_dict(),
            "rm_scheduler": opt.rm_scheduler.state_dict() if opt.rm_scheduler is not None else None,
            "sampler": s.sampler.state_dict(),
            "sampling_generator": s.sampling_generator.get_state(),
            "rollout_memory": s.rollout.memory_state() if s.rollout is not None else {},
            "rng": ckpt.rng_state(),
        }

    def owes_state(self, done: int) -> bool:
        """A stop after ``done`` finished steps writes a resume state: one finished since the last
        checkpoint, and the config asks for states on a signal."""
        return done > self._saved and self.cfg.save_on_signal and self.cfg.keep_resume_states > 0

    def save_after_stop(self, done: int) -> tuple[str, str | None]:
        """After a stop signal: the resume state of the last finished step when `owes_state` (with
        the HF folder too when that step's checkpoint was due); -> what is on disk (`on_disk`)."""
        failed = ""
        if self.owes_state(done):
            try:
                self.save(done - 1, hf_folder=self.due(done))
            except CheckpointWriteError as e:
                failed = f"{e}; "
        outcome, resume_dir = self.on_disk(done)
        return failed + outcome, resume_dir

    def on_disk(self, done: int) -> tuple[str, str | None]:
        """What a resume would start from after ``done`` finished steps, and the folder to resume."""
        if self._state_on_disk is None:
            why = " (keep_resume_states = 0)" if self.cfg.keep_resume_states == 0 else ""
            return f"no resume state is on disk{why}", None
        name = os.path.basename(self._state_on_disk)
        saved = int(name[len("state-"):-len(".pt")])
        lost = f"; step(s) {saved + 1}..{done} finished but are not in it" if done > saved else ""
        return f"resume state {name} ({saved} step(s) done) is on disk{lost}", self.run_dir

    def explain(self, error: CheckpointWriteError | StepOutOfMemory, done: int) -> None:
        """Adds what is on disk and the folder to resume to an error that ends the run (a failed
        checkpoint write, a step out of GPU memory)."""
        outcome, error.resume_dir = self.on_disk(done)
        error.args = (f"{error}; {outcome}",)

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
