"""A step that runs out of GPU memory ends in one line (exit 3) naming the step, the phase and the
keys that would fit it, with the last verified resume state intact and the command that continues.

The error is injected where the RL phase allocates (``trainer.rl_phase``), as the CUDA allocator
raises it; the GPU version (a real allocation past a real `gpu_memory_limit_gib`, with a KV pool
small enough to make the engine preempt) runs in test_trainer_gpu.py."""

from __future__ import annotations

import os

import pytest
import torch

from oreal_fast import checkpoint as ckpt
from oreal_fast import trainer
from oreal_fast.train import OUT_OF_MEMORY_EXIT, main

from cli_driver import EvenLengthRouter
from trainer_helpers import write_config


@pytest.fixture(autouse=True)
def even_length_judger(monkeypatch):
    monkeypatch.setattr(trainer, "Router", EvenLengthRouter)


def test_out_of_memory_in_the_rl_phase(tmp_path, tiny_model_dir, prompt_file, monkeypatch, capsys):
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, total_steps=3, checkpoint_interval=1,
                       actor_freeze_steps=0, gen_max_new=6, gen_max_length=80, debug=False)
    real_rl_phase, calls = trainer.rl_phase, []

    def rl_phase_that_runs_out(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_rl_phase(*args, **kwargs)

    monkeypatch.setattr(trainer, "rl_phase", rl_phase_that_runs_out)
    with pytest.raises(SystemExit) as e:
        main([cfg])
    err = capsys.readouterr().err
    (run_name,) = os.listdir(tmp_path / "work")
    run = os.path.join(tmp_path / "work", run_name)
    assert e.value.code == OUT_OF_MEMORY_EXIT and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "out of GPU memory in step 2, phase rl: peak not measured off CUDA, cap none (CUDA out of memory. Tried "
        "to allocate 2.00 GiB); to fit, try: a smaller rl_micro_batch_tokens (tokens per micro-batch); "
        "selective_recompute up to 1.0 (recompute every block); a kv_cache_gib below the logged rollout_kv_pool_gib "
        "(the KV pool stays allocated while the RL phase runs); rollout_keep_cache False; resume state state-1.pt (1 step(s) done) is on disk; continue with: "
        f"{os.path.basename(os.sys.executable)} -m oreal_fast.train {cfg} --resume {run}")
    assert sorted(os.listdir(os.path.join(run, "resume"))) == ["state-1.json", "state-1.pt"]
    assert ckpt.verify_state(ckpt.state_path(run, 1)) is None
