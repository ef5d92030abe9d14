"""The run folder: created once, named uniquely, written by one process at a time.

A fresh run gets ``<work_dir>/<YYYYmmddHHMMSS>`` (``-2``, ``-3``, ... when that name exists),
made with an exclusive ``mkdir`` so two runs started in the same second never share one and no
name is ever reused. Before anything is written into it, the process takes an exclusive
``fcntl.flock`` on ``run.lock`` inside it and writes its PID there; a resume of a folder a live run
holds stops with the holder's PID. The kernel drops the lock when the process ends, however it
ends (``kill -9`` too). It takes folders, not the config: a failure is a :class:`RunFolderError`
naming the config key that chose the folder, and the caller adds the config file's name. What this
module does not do: write checkpoints or metrics, or decide how much room they need.

Invariant: while a :class:`RunFolder` is open, its process is the only one writing the folder.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from datetime import datetime

from oreal_fast.config import ConfigError

LOCK_FILE = "run.lock"
# what an interrupted atomic write leaves: NAME.tmp-PID (being written) or NAME.old-PID (being replaced)
_PARTIAL = re.compile(r"\.(tmp|old)-\d+$")


class RunFolderError(ConfigError):
    """A run folder that cannot be made, locked or written; ``key`` is the config key that chose it
    (``work_dir`` or ``resume``), which the caller names together with the config file."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class CheckpointWriteError(Exception):
    """A checkpoint write into the run folder failed (disk full, I/O error); its partial files are
    already removed. ``resume_dir`` is the folder to resume from, None when no state is on disk."""

    resume_dir: str | None = None


def nearest_existing(path: str) -> str:
    """``path``, or its nearest ancestor that exists (where a folder to be made would land)."""
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def free_bytes(path: str) -> int:
    """Bytes free on the filesystem ``path`` is on (or would be on)."""
    return shutil.disk_usage(nearest_existing(path)).free


def check_work_dir(work_dir: str) -> None:
    """``work_dir`` exists as a writable folder, or can be created; else a RunFolderError.

    Nothing is created here, so a start that fails later leaves no trace in ``work_dir``.
    """
    existing = nearest_existing(work_dir)
    if not os.path.isdir(existing):
        below = "is" if existing == os.path.abspath(work_dir) else "would be below"
        raise RunFolderError("work_dir", f"{work_dir!r} {below} the regular file {existing!r}; a folder is needed")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunFolderError("work_dir", f"{existing!r} is not writable by this user, so {work_dir!r} cannot be used")


class RunFolder:
    """An open run folder: its path and the lock this process holds on it."""

    def __init__(self, path: str, lock_fd: int) -> None:
        self.path = path
        self._lock_fd = lock_fd

    @classmethod
    def create(cls, work_dir: str, now: datetime | None = None) -> RunFolder:
        """A new, uniquely named folder under ``work_dir``, locked before it is returned."""
        stamp = (now or datetime.now()).strftime("%Y%m%d%H%M%S")
        try:
            os.makedirs(work_dir, exist_ok=True)
            for n in range(1, 10_000):
                path = os.path.join(work_dir, stamp if n == 1 else f"{stamp}-{n}")
                try:
                    os.mkdir(path)  # exclusive: fails if another run made this name first
                    break
                except FileExistsError:
                    continue
            else:
                raise RunFolderError("work_dir", f"9999 run folders named {stamp}* exist")
        except OSError as e:
            raise RunFolderError("work_dir", f"cannot create a run folder in {work_dir!r} "
                                 f"({os.strerror(e.errno) if e.errno else e})") from e
        return cls(path, _lock(path))

    @classmethod
    def reopen(cls, path: str) -> RunFolder:
        """An existing run folder (a resume), locked; fails naming the PID of a live run holding it."""
        return cls(path, _lock(path))

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


def _lock(path: str) -> int:
    """Takes the folder's lock and writes this PID into it."""
    lock_path = os.path.join(path, LOCK_FILE)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunFolderError("work_dir", f"cannot write into the run folder {path!r} "
                             f"({os.strerror(e.errno) if e.errno else e})") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunFolderError("resume", f"the run folder {path} is in use by the live process PID {holder} (it "
                             f"holds {LOCK_FILE}); wait for it to end or stop it first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _size(path: str) -> int:
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)
