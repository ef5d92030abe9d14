"""The run folder: created once, named uniquely, written by one process at a time.

A fresh run gets ``<work_dir>/<YYYYmmddHHMMSS>`` (``-2``, ``-3``, ... when that name exists),
made with an exclusive ``mkdir`` so two runs started in the same second never share one and no
name is ever reused. Before anything is written into it, the process takes an exclusive
``fcntl.flock`` on ``run.lock`` inside it and writes its PID there; a resume of a folder a live run
holds stops with the holder's PID. The kernel drops the lock when the process ends, however it
ends (``kill -9`` too). What this module does not do: write checkpoints or metrics.

Invariant: while a :class:`RunFolder` is open, its process is the only one writing the folder.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from datetime import datetime

from oreal_fast.config import ConfigError, TrainConfig

LOCK_FILE = "run.lock"
# what an interrupted atomic write leaves: NAME.tmp-PID (being written) or NAME.old-PID (being replaced)
_PARTIAL = re.compile(r"\.(tmp|old)-\d+$")


class CheckpointWriteError(Exception):
    """A checkpoint write into the run folder failed (disk full, I/O error); its partial files are
    already removed. ``resume_dir`` is the folder to resume from, None when no state is on disk."""

    resume_dir: str | None = None


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def check_work_dir(cfg: TrainConfig) -> None:
    """``work_dir`` exists as a writable folder, or can be created: else a config error naming it.

    Nothing is created here, so a start that fails later leaves no trace in ``work_dir``.
    """
    existing = _nearest_existing(cfg.work_dir)
    where = f"work_dir in {cfg.config_path}"
    if not os.path.isdir(existing):
        below = "is" if existing == os.path.abspath(cfg.work_dir) else "would be below"
        raise ConfigError(f"{where}: {cfg.work_dir!r} {below} the regular file {existing!r}; "
                          "a folder is needed")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: {existing!r} is not writable by this user, so {cfg.work_dir!r} "
                          "cannot be used")


def check_free_space(cfg: TrainConfig, path: str, need: int, detail: str) -> None:
    """A config error naming ``work_dir`` when the filesystem of ``path`` has less than ``need`` bytes free."""
    from oreal_fast.checkpoint import size_text

    free = shutil.disk_usage(_nearest_existing(path)).free
    if free < need:
        raise ConfigError(f"work_dir in {cfg.config_path}: a checkpoint needs {size_text(need)} ({detail}) "
                          f"but {_nearest_existing(path)} has {size_text(free)} free; free some space, "
                          "pick another work_dir or lower keep_resume_states")


class RunFolder:
    """An open run folder: its path and the lock this process holds on it."""

    def __init__(self, path: str, lock_fd: int) -> None:
        self.path = path
        self._lock_fd = lock_fd

    @classmethod
    def create(cls, cfg: TrainConfig, now: datetime | None = None) -> RunFolder:
        """A new, uniquely named folder under ``work_dir``, locked before it is returned."""
        stamp = (now or datetime.now()).strftime("%Y%m%d%H%M%S")
        try:
            os.makedirs(cfg.work_dir, exist_ok=True)
            for n in range(1, 10_000):
                path = os.path.join(cfg.work_dir, stamp if n == 1 else f"{stamp}-{n}")
                try:
                    os.mkdir(path)  # exclusive: fails if another run made this name first
                    break
                except FileExistsError:
                    continue
            else:
                raise ConfigError(f"work_dir in {cfg.config_path}: 9999 run folders named {stamp}* exist")
        except OSError as e:
            raise ConfigError(f"work_dir in {cfg.config_path}: cannot create a run folder in "
                              f"{cfg.work_dir!r} ({os.strerror(e.errno) if e.errno else e})") from e
        return cls(path, _lock(path, cfg))

    @classmethod
    def reopen(cls, path: str, cfg: TrainConfig) -> RunFolder:
        """An existing run folder (a resume), locked; fails naming the PID of a live run holding it."""
        return cls(path, _lock(path, cfg))

    def remove_partial_writes(self) -> str | None:
        """Removes what interrupted atomic writes left (``*.tmp-PID``, ``*.old-PID``) in the folder and
        its ``resume/``; returns one line saying what was freed, or None when there was nothing."""
        found = []
        for folder in (self.path, os.path.join(self.path, "resume")):
            if os.path.isdir(folder):
                found += [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if _PARTIAL.search(n)]
        if not found:
            return None
        freed = sum(_size(p) for p in found)
        for p in found:
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
        names = ", ".join(os.path.relpath(p, self.path) for p in found)
        return (f"removed {len(found)} partial file(s) left by an interrupted write, {freed / 2**20:.1f} MiB freed: "
                f"{names}")

    def remove(self) -> None:
        """Deletes a folder this process created and nothing was run in (a start that failed)."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = -1


def _lock(path: str, cfg: TrainConfig) -> int:
    lock_path = os.path.join(path, LOCK_FILE)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"work_dir in {cfg.config_path}: cannot write into the run folder {path!r} "
                          f"({os.strerror(e.errno) if e.errno else e})") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(f"resume in {cfg.config_path}: the run folder {path} is in use by the live process "
                          f"PID {holder} (it holds {LOCK_FILE}); wait for it to end or stop it first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _size(path: str) -> int:
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)
