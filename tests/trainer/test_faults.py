"""Faults outside the algorithm end in one line, never a traceback: a disk that fills or fails while a
checkpoint is written (exit 1, the previous state intact, no partial file left), too little free
space or an unusable work_dir before step 1 (exit 2, nothing created), a run folder a live process
holds (exit 2 naming its PID), and two runs started in the same second (two folders).

Faults are injected through the checkpoint writer (``checkpoint.open_for_writing`` and the HF-folder
writer), never by filling a real disk. The command line runs in this process (``train.main``) with
the tiny random model and the even-length judger of ``cli_driver``."""

from __future__ import annotations

import errno
import io
import json
import os
import re
from collections import namedtuple
from datetime import datetime

import pytest

from oreal_fast import checkpoint as ckpt
from oreal_fast import run_dir as run_dir_module
from oreal_fast import trainer
from oreal_fast.config import ConfigError, load_config
from oreal_fast.run_dir import RunFolder
from oreal_fast.train import main

from cli_driver import EvenLengthRouter
from trainer_helpers import write_config

SMALL = dict(total_steps=2, checkpoint_interval=1, actor_freeze_steps=1, gen_max_new=6, gen_max_length=80,
             debug=False)


@pytest.fixture(autouse=True)
def even_length_judger(monkeypatch):
    monkeypatch.setattr(trainer, "Router", EvenLengthRouter)


def cli(capsys, *argv: str) -> tuple[int, str]:
    """Runs the command line; returns its exit code and the last line of stderr."""
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return e.value.code, err.strip().splitlines()[-1]


def only_run(work_dir) -> str:
    (name,) = os.listdir(work_dir)
    return os.path.join(work_dir, name)


def leftovers(run_dir: str) -> list[str]:
    return [os.path.join(r, n) for r, ds, fs in os.walk(run_dir) for n in ds + fs if ".tmp-" in n or ".old-" in n]


class FailingFile(io.FileIO):
    """Writes ``limit`` bytes, then fails as a full disk does."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(path, "wb")
        self.left = limit

    def write(self, data) -> int:
        if len(data) > self.left:
            super().write(bytes(data)[: self.left])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= len(data)
        return super().write(data)


def test_full_disk_while_writing_a_resume_state(tmp_path, tiny_model_dir, prompt_file, monkeypatch, capsys):
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, **SMALL)
    real_open = ckpt.open_for_writing
    monkeypatch.setattr(ckpt, "open_for_writing", lambda path: FailingFile(path, 4096) if "state-2.pt" in path
                        else real_open(path))
    code, last = cli(capsys, cfg)
    run = only_run(tmp_path / "work")
    assert code == 1
    assert last == (f"checkpoint error: writing resume state {run}/resume/state-2.pt failed (No space left on "
                    f"device); its partial files were removed; resume state state-1.pt (1 step(s) done) is on disk; "
                    f"step(s) 2..2 finished but are not in it; continue with: "
                    f"{os.path.basename(os.sys.executable)} -m oreal_fast.train {cfg} --resume {run}")
    assert leftovers(run) == []
    assert sorted(os.listdir(os.path.join(run, "resume"))) == ["state-1.json", "state-1.pt"]
    assert ckpt.verify_state(ckpt.state_path(run, 1)) is None
    with open(os.path.join(run, "rank0.log.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2]  # step 2's row was written first


def test_io_error_while_writing_the_hf_folder(tmp_path, tiny_model_dir, prompt_file, monkeypatch, capsys):
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, **SMALL)
    real_save = ckpt.save_hf_checkpoint

    def failing_save(model, tokenizer, folder, *, dtype, weights=None):
        if os.path.basename(folder).startswith("hf-2"):
            with open(os.path.join(folder, "model.safetensors"), "wb") as f:
                f.write(bytes(1000))
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_save(model, tokenizer, folder, dtype=dtype, weights=weights)

    monkeypatch.setattr(ckpt, "save_hf_checkpoint", failing_save)
    code, last = cli(capsys, cfg)
    run = only_run(tmp_path / "work")
    assert code == 1
    assert last.startswith(f"checkpoint error: writing folder {run}/hf-2 failed (Input/output error); its partial "
                           "files were removed; resume state state-1.pt (1 step(s) done) is on disk")
    assert leftovers(run) == [] and not os.path.exists(os.path.join(run, "hf-2"))
    assert ckpt.verify_state(ckpt.state_path(run, 1)) is None


def test_too_little_free_space_exits_2_before_step_1(tmp_path, tiny_model_dir, prompt_file, monkeypatch, capsys):
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, **SMALL)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(run_dir_module.shutil, "disk_usage", lambda path: usage(2**20, 2**20 - 1000, 1000))
    code, last = cli(capsys, cfg)
    assert code == 2
    # the tiny model: 26 208 parameters; HF folder 2 bytes each, a state 3 x 4 bytes each for actor and RM
    assert re.fullmatch(rf"config error: work_dir in {re.escape(cfg)}: a checkpoint needs (\S+) MiB \(HF folder "
                        r"(\S+) MiB \+ 2 resume state\(s\) x (\S+) MiB\) but /\S* has 0\.00 MiB free; free some "
                        r"space, pick another work_dir or lower keep_resume_states", last)
    need, hf, state = map(float, re.fullmatch(r".* needs (\S+) MiB \(HF folder (\S+) MiB \+ 2 resume state\(s\) "
                                              r"x (\S+) MiB.*", last).groups())
    assert need == pytest.approx(hf + 2 * state, abs=0.01) and state > 6 * hf  # 12 bytes x 2 models vs 2 bytes
    assert not os.path.exists(tmp_path / "work")


def test_checkpoint_bytes_count_parameters_and_dtypes(tiny_model_dir):
    from oreal_fast.model.hf_io import load_decoder, load_token_rm
    import torch

    actor = load_decoder(tiny_model_dir, dtype=torch.float32, device="cpu")
    rm = load_token_rm(tiny_model_dir, dtype=torch.float32, device="cpu")
    n_actor = sum(p.numel() for p in actor.parameters())
    n_rm = sum(p.numel() for p in rm.parameters())
    assert ckpt.checkpoint_bytes(actor, [actor, rm]) == (2 * n_actor, 12 * (n_actor + n_rm))


@pytest.mark.parametrize("where", ["is", "below"])
def test_work_dir_that_cannot_be_a_folder_is_a_config_error(tmp_path, tiny_model_dir, prompt_file, capsys, where):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    work_dir = blocker if where == "is" else blocker / "runs"
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, work_dir=str(work_dir), **SMALL)
    code, last = cli(capsys, cfg)
    verb = "is" if where == "is" else "would be below"
    assert (code, last) == (2, f"config error: work_dir in {cfg}: {str(work_dir)!r} {verb} the regular file "
                               f"{str(blocker)!r}; a folder is needed")


def test_resuming_a_folder_a_live_run_holds_exits_2_naming_its_pid(tmp_path, tiny_model_dir, prompt_file, capsys):
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, **SMALL)
    main([cfg])
    capsys.readouterr()
    run = only_run(tmp_path / "work")
    holder = RunFolder.reopen(run)  # this process now plays the live run
    try:
        code, last = cli(capsys, cfg, "--resume", "auto", "--total_steps", "3")
    finally:
        holder.close()
    assert (code, last) == (2, f"config error: resume in {cfg}: the run folder {run} is "
                               f"in use by the live process PID {os.getpid()} (it holds run.lock); wait for it to "
                               "end or stop it first")


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path, tiny_model_dir, prompt_file):
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file))
    now = datetime(2026, 12, 3, 14, 0, 0)
    first, second = RunFolder.create(cfg.work_dir, now), RunFolder.create(cfg.work_dir, now)
    assert [os.path.basename(f.path) for f in (first, second)] == ["20261203140000", "20261203140000-2"]
    with open(os.path.join(second.path, "run.lock")) as f:
        assert f.read() == f"{os.getpid()}\n"
    first.close()
    second.close()
    with pytest.raises(ConfigError, match="cannot create a run folder"):
        RunFolder.create(load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file,
                                                  work_dir="/proc/no_run_here")).work_dir)
