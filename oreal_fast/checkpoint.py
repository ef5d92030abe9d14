"""Checkpoints: the official actor folders ``hf-{step}`` plus the state a resume needs.

The official trainer saves only the actor as an HF folder (reference 5.3) and cannot resume. We
save the same folders and, beside them, ``resume/state-{step}.pt``: fp32 actor and token-RM weights,
both optimizers, both LR schedulers, the prompt-sampler position and every RNG state.

Invariant: whatever a crash interrupts, the last complete checkpoint stays readable. Every file is
written to a temporary name, fsynced and renamed into place; ``resume/latest`` (a one-line pointer)
is replaced last, so it never names a state that is not fully on disk.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
from typing import Any, Callable

import numpy as np
import torch

RESUME_DIR = "resume"
LATEST_POINTER = "latest"


def hf_folder_name(step: int, total_steps: int) -> str:
    """``hf-{step}`` zero-padded to the digits of ``total_steps`` (hf-10 .. hf-90; hf-010 for 100)."""
    return f"hf-{step:0{len(str(total_steps))}d}"


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


def write_folder_atomically(final_dir: str, write: Callable[[str], None]) -> None:
    """Calls ``write(tmp_dir)``, fsyncs it, then renames it to ``final_dir`` (replacing an old one)."""
    tmp_dir = f"{final_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    write(tmp_dir)
    _fsync_tree(tmp_dir)
    if os.path.exists(final_dir):
        old = f"{final_dir}.old-{os.getpid()}"
        os.replace(final_dir, old)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)


def _write_file_atomically(path: str, write: Callable[[str], None]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU (and CUDA when present) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_resume_state(run_dir: str, step: int, state: dict[str, Any]) -> str:
    """Writes ``resume/state-{step}.pt`` atomically, points ``latest`` at it, drops older states.

    Args:
        run_dir: the run folder.
        step: number of finished steps (1-based: the state resumes at 0-based step ``step``).
        state: anything ``torch.save`` takes.
    Returns:
        The path written.
    """
    folder = os.path.join(run_dir, RESUME_DIR)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"state-{step}.pt")
    _write_file_atomically(path, lambda tmp: torch.save(state, tmp))

    def write_pointer(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(os.path.basename(path) + "\n")

    _write_file_atomically(os.path.join(folder, LATEST_POINTER), write_pointer)
    for old in glob.glob(os.path.join(folder, "state-*.pt")):
        if old != path:
            os.remove(old)
    return path


def find_resume_state(resume: str, work_dir: str) -> str | None:
    """Resolves ``--resume``: ``auto`` = the newest run under ``work_dir`` with a state; else a path.

    A path may name a ``state-*.pt`` file, a ``resume`` folder or a run folder.
    """
    if resume == "auto":
        runs = sorted(glob.glob(os.path.join(work_dir, "*", RESUME_DIR, LATEST_POINTER)), reverse=True)
        return _read_pointer(os.path.dirname(runs[0])) if runs else None
    if os.path.isfile(resume):
        return resume
    for folder in (resume, os.path.join(resume, RESUME_DIR)):
        if os.path.isfile(os.path.join(folder, LATEST_POINTER)):
            return _read_pointer(folder)
    raise FileNotFoundError(f"--resume {resume}: no resume state found there (expected {RESUME_DIR}/{LATEST_POINTER})")


def _read_pointer(resume_folder: str) -> str:
    with open(os.path.join(resume_folder, LATEST_POINTER), encoding="utf-8") as f:
        return os.path.join(resume_folder, f.read().strip())


def load_resume_state(path: str) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)
