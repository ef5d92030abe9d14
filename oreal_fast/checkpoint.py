"""Checkpoints: the official actor folders ``hf-{step}`` plus the states a resume needs.

The official trainer saves only the actor as an HF folder (reference 5.3) and cannot resume. We
save the same folders and, beside them, ``resume/state-{step}.pt``: fp32 actor and token-RM weights,
both optimizers, both LR schedulers, the prompt-sampler position and every RNG state. Each state has
a manifest ``resume/state-{step}.json`` (size and SHA-256 of the state file) written after it; the
newest ``keep`` complete states stay on disk, older ones are removed once a newer one is complete.
What this module does not do: decide when to save (the trainer) or own the run folder (``run_dir``).

Invariant: a state counts only when its manifest verifies, so whatever interrupts a write (a crash,
a full disk, a signal, a file cut short later), the newest state that verifies is a complete one.
Every file is written to ``NAME.tmp-PID``, fsynced and renamed into place; the manifest comes last.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

import numpy as np
import torch
from safetensors import SafetensorError

from oreal_fast.model.hf_io import save_hf_checkpoint
from oreal_fast.run_dir import CheckpointWriteError

RESUME_DIR = "resume"
_STATE = re.compile(r"^state-(\d+)\.(pt|json)$")
_CHUNK = 16 << 20  # bytes read at a time when verifying a checksum


def hf_folder_name(step: int, total_steps: int) -> str:
    """``hf-{step}`` zero-padded to the digits of ``total_steps`` (hf-10 .. hf-90; hf-010 for 100)."""
    return f"hf-{step:0{len(str(total_steps))}d}"


def tmp_name(path: str) -> str:
    """The name a file or folder is written under before it is renamed to ``path``."""
    return f"{path}.tmp-{os.getpid()}"


def open_for_writing(path: str) -> BinaryIO:
    """Every byte of a resume state and its manifest goes through the file this returns (tests
    replace it to inject a full disk or an I/O error)."""
    return open(path, "wb")


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    """Makes renames inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _write_error(what: str, path: str, e: Exception) -> CheckpointWriteError:
    reason = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
    return CheckpointWriteError(f"writing {what} {path} failed ({reason}); its partial files were removed")


def write_folder_atomically(final_dir: str, write: Callable[[str], None]) -> None:
    """Calls ``write(tmp_dir)``, fsyncs it, then renames it to ``final_dir`` (replacing an old one).

    Raises:
        CheckpointWriteError: when ``write`` or the disk fails; the temporary folder is gone then.
    """
    tmp_dir = tmp_name(final_dir)
    try:
        _remove(tmp_dir)
        os.makedirs(tmp_dir)
        write(tmp_dir)
        _fsync_tree(tmp_dir)
        if os.path.exists(final_dir):
            old = f"{final_dir}.old-{os.getpid()}"
            os.replace(final_dir, old)
            os.replace(tmp_dir, final_dir)
            _remove(old)
        else:
            os.replace(tmp_dir, final_dir)
    except (OSError, SafetensorError) as e:  # safetensors reports a full disk as its own error
        _remove(tmp_dir)
        raise _write_error("folder", final_dir, e) from e


def save_hf_folder(folder: str, model: torch.nn.Module, tokenizer: Any,
                   weights: dict[str, torch.Tensor] | None = None) -> None:
    """The official ``hf-{step}`` actor folder, bf16, written atomically (``weights``: see
    ``save_hf_checkpoint``)."""
    write_folder_atomically(folder, lambda tmp: save_hf_checkpoint(model, tokenizer, tmp, dtype=torch.bfloat16,
                                                                   weights=weights))


class _HashingWriter:
    """A write-only file that counts and hashes what passes through it (no second read).

    torch.save turns a failed write into a RuntimeError of its zip writer; ``error`` keeps the
    OSError underneath (ENOSPC, EIO) so that the caller can report what the disk said.
    """

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.num_bytes += len(data)
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _write_file(path: str, write: Callable[[BinaryIO], None]) -> None:
    """``write(f)`` into ``path.tmp-PID``, fsync, rename to ``path``; the tmp file never survives a failure."""
    tmp = tmp_name(path)
    try:
        with open_for_writing(tmp) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


# ----------------------------------------------------------------------------- resume states


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


def state_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, RESUME_DIR, f"state-{step}.pt")


def _manifest_path(path: str) -> str:
    return path[: -len(".pt")] + ".json"


def state_steps(run_dir: str) -> list[int]:
    """Steps that have any resume-state file (state or manifest) in the run folder, newest first."""
    folder = os.path.join(run_dir, RESUME_DIR)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted({int(m.group(1)) for m in map(_STATE.match, names) if m}, reverse=True)


def save_resume_state(run_dir: str, step: int, state: dict[str, Any], keep: int) -> str:
    """Writes ``resume/state-{step}.pt`` and its manifest, then keeps only the newest ``keep`` states.

    Args:
        run_dir: the run folder.
        step: number of finished steps (1-based: the state resumes at 0-based step ``step``).
        state: anything ``torch.save`` takes.
        keep: complete states to keep, >= 1.
    Returns:
        The path written.
    Raises:
        CheckpointWriteError: the disk failed; nothing of this state is left, older states are untouched.
    """
    folder = os.path.join(run_dir, RESUME_DIR)
    path = state_path(run_dir, step)
    manifest = _manifest_path(path)
    try:
        os.makedirs(folder, exist_ok=True)
        _remove(manifest)  # an older manifest of this step must never vouch for the new file
        hashed: list[_HashingWriter] = []

        def write_state(f: BinaryIO) -> None:
            hashed.append(_HashingWriter(f))
            try:
                torch.save(state, hashed[0])
            except RuntimeError:
                if hashed[0].error is None:
                    raise
                raise hashed[0].error from None

        _write_file(path, write_state)
        entry = {"bytes": hashed[0].num_bytes, "sha256": hashed[0].sha256.hexdigest()}
        text = json.dumps({"step": step, "files": {os.path.basename(path): entry}}, indent=1) + "\n"
        _write_file(manifest, lambda f: f.write(text.encode()))
        _fsync_dir(folder)
    except OSError as e:
        _remove(path)
        _remove(manifest)
        raise _write_error("resume state", path, e) from e
    _prune(run_dir, keep)
    return path


def _prune(run_dir: str, keep: int) -> None:
    """Removes every state but the newest ``keep`` that have a manifest."""
    folder = os.path.join(run_dir, RESUME_DIR)
    complete = [s for s in state_steps(run_dir) if os.path.isfile(os.path.join(folder, f"state-{s}.json"))]
    for step in set(state_steps(run_dir)) - set(complete[:keep]):
        remove_state(run_dir, step)


def states_bytes(run_dir: str) -> int:
    """Bytes the state files with a manifest take in the run folder."""
    paths = [state_path(run_dir, s) for s in state_steps(run_dir)]
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p) and os.path.isfile(_manifest_path(p)))


def remove_state(run_dir: str, step: int) -> None:
    path = state_path(run_dir, step)
    _remove(path)
    _remove(_manifest_path(path))


def verify_state(path: str) -> str | None:
    """None when the manifest beside ``path`` vouches for it; else what is wrong, in a few words."""
    manifest = _manifest_path(path)
    name = os.path.basename(path)
    try:
        with open(manifest, encoding="utf-8") as f:
            entry = json.load(f)["files"][name]
        expected_bytes, expected_sha = int(entry["bytes"]), str(entry["sha256"])
    except FileNotFoundError:
        return f"{name} has no manifest (its write was cut short)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its manifest {os.path.basename(manifest)} is unreadable ({type(e).__name__})"
    try:
        size = os.path.getsize(path)
        if size != expected_bytes:
            return f"{name} has {size} bytes, its manifest says {expected_bytes}"
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except FileNotFoundError:
        return f"{name} is missing"
    except OSError as e:
        return f"{name} cannot be read ({os.strerror(e.errno) if e.errno else e})"
    if digest.hexdigest() != expected_sha:
        return f"{name} does not match its manifest's SHA-256"
    return None


@dataclass
class ResumeChoice:
    """The state a resume starts from, and what was found wrong with newer ones."""

    run_dir: str
    path: str
    damaged: list[tuple[int, str]]  # (step, what is wrong), newest first

    def fallback_note(self) -> str | None:
        """One line when a newer state was passed over; None when the newest one verified."""
        if not self.damaged:
            return None
        found = "; ".join(f"state-{s}: {why}" for s, why in self.damaged)
        return (f"resume: newest state(s) in {os.path.join(self.run_dir, RESUME_DIR)} damaged ({found}); "
                f"resuming from {os.path.basename(self.path)} instead and removing the damaged one(s)")


class NoResumeState(Exception):
    """``--resume`` found nothing it can trust; the message says where it looked and what it found."""


def resume_run_dir(resume: str, work_dir: str) -> str | None:
    """The run folder ``--resume`` names: ``auto`` = the newest run under ``work_dir`` holding any
    state file (None if there is none); a state file -> its run; a ``resume`` folder -> its run."""
    if resume == "auto":
        runs = sorted((os.path.dirname(os.path.dirname(p)) for p in
                       glob.glob(os.path.join(glob.escape(work_dir), "*", RESUME_DIR, "state-*"))), reverse=True)
        return runs[0] if runs else None
    path = os.path.abspath(resume)
    if os.path.isfile(path):
        return os.path.dirname(os.path.dirname(path))
    if os.path.basename(path.rstrip(os.sep)) == RESUME_DIR:
        return os.path.dirname(path.rstrip(os.sep))
    return path


def choose_resume_state(resume: str, run_dir: str) -> ResumeChoice:
    """The newest state of ``run_dir`` that verifies (or exactly the file ``resume`` names).

    Raises:
        NoResumeState: no state there verifies; the message lists each one found and its fault.
    """
    if os.path.isfile(resume):
        why = verify_state(resume)
        if why is not None:
            raise NoResumeState(f"{resume} cannot be trusted: {why}")
        return ResumeChoice(run_dir, os.path.abspath(resume), [])
    steps = state_steps(run_dir)
    if not steps:
        raise NoResumeState(f"{run_dir}: no resume state there (expected {RESUME_DIR}/state-N.pt with its "
                            "manifest state-N.json)")
    damaged = []
    for step in steps:
        why = verify_state(state_path(run_dir, step))
        if why is None:
            return ResumeChoice(run_dir, state_path(run_dir, step), damaged)
        damaged.append((step, why))
    found = "; ".join(f"state-{s}: {why}" for s, why in damaged)
    raise NoResumeState(f"{os.path.join(run_dir, RESUME_DIR)}: no resume state verifies ({found})")


def load_resume_state(path: str) -> dict[str, Any]:
    """The resume state's objects, its tensors mapped from the file (``mmap``) rather than read into
    the heap: a state holds 16 bytes per trained parameter (2.2 GB at 135M, 112 GB at 7B), and once
    its tensors are copied into the GPU models and optimisers, the mapping goes with them (read into
    the heap, a freed copy can stay with the process: an H100 run of the 135M evidence config held
    1.8 GB more host memory for 40 steps after a resume than before it). A state is written to a new
    file and renamed into place, never rewritten, so the mapped file does not change under a run."""
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)


# ----------------------------------------------------------------------------- sizes


def checkpoint_bytes(actor: torch.nn.Module, trained: list[torch.nn.Module]) -> tuple[int, int]:
    """(HF folder, one resume state) in bytes, from parameter counts and dtypes.

    The HF folder is the actor in bf16; a state holds every trained model's master weights and
    AdamW's two moments (same dtype as the weights), so 3 x the master bytes. Tokenizer files,
    RNG states and the config add a few MB at most, below the rounding of what is reported.
    """
    hf = sum(p.numel() for p in actor.parameters()) * torch.finfo(torch.bfloat16).bits // 8
    state = sum(3 * p.numel() * p.element_size() for m in trained for p in m.parameters())
    return hf, state


def size_text(num_bytes: float) -> str:
    """Bytes as GiB from 1 GiB up, else as MiB."""
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.2f} MiB"
