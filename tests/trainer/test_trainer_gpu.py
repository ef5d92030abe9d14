"""The trainer loop on a CUDA GPU as a user runs it: default dtype (bf16 autocast over fp32 masters),
the default rollout engine and the Triton kernels, 3 steps with a checkpoint after each; then a run
killed while generating step 3 and resumed with ``--resume auto`` logs the steps the straight run logs.

Tolerance of the resumed run: integer counts equal; floats within rel 2e-2. A resumed run restores
the exact fp32 weights, optimiser and RNG states, so on one GPU the values agree to rounding; the
bound allows for kernels whose bf16 reduction order is not fixed (flash attention's backward)
without letting a wrong restore through (a restore that drops the optimiser state or the sampling
RNG changes the losses by tens of percent).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from oreal_fast.config import load_config
from oreal_fast.metrics import reproducible_metrics
from oreal_fast.trainer import Trainer

from trainer_helpers import save_random_qwen2, write_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the trainer loop on a GPU needs CUDA")

@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory) -> str:
    """A random-init Qwen2 wide enough for the flash kernels (head_dim 32, GQA 4/2, 2 layers)."""
    return save_random_qwen2(tmp_path_factory.mktemp("gpu_qwen2"), 4321, hidden_size=128, intermediate_size=256,
                             initializer_range=0.1)


class CrashingRollout:
    """Delegates to the trainer's own engine and raises at one call, as a kill would stop the run."""

    def __init__(self, engine, fail_at_call: int):
        self.engine, self.fail_at_call, self.calls = engine, fail_at_call, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params, generator):
        if self.calls == self.fail_at_call:
            raise RuntimeError("killed while generating")
        self.calls += 1
        return self.engine.generate(prompts, params, generator)


def _config(tmp_path, model_dir, prompt_file) -> str:
    return write_config(tmp_path, model_dir, model_dir, prompt_file, dtype="auto", device="cuda",
                        loss_impl="auto", total_steps=3, checkpoint_interval=1, filter_trajectory=False,
                        gen_max_new=24, actor_freeze_steps=0, debug=False, temperature=1.0)


def _rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "rank0.log.jsonl")) as f:
        return [reproducible_metrics(json.loads(line)) for line in f]


def _assert_rows_match(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for key, value in e.items():
            if isinstance(value, int) and not isinstance(value, bool):
                assert g[key] == value, (e["step"], key)
            else:
                assert g[key] == pytest.approx(value, rel=2e-2, abs=1e-6), (e["step"], key)


def test_trainer_loop_runs_checkpoints_and_resumes_on_gpu(tmp_path, gpu_model_dir, prompt_file):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    straight = Trainer(load_config(_config(tmp_path / "a", gpu_model_dir, prompt_file)))
    assert straight.runtime.compute_dtype == torch.bfloat16
    assert straight.models.actor.attn_backend == "by_length"  # chosen for bf16 compute, not the fp32 masters
    expected = _rows(straight.fit())
    assert [r["step"] for r in expected] == [1, 2, 3]
    assert all(r["num_rl_tokens"] > 0 and r["rl_loss"] == r["rl_loss"] for r in expected)  # trained, finite
    assert expected[-1]["actor_grad_norm"] > 0

    cfg_path = _config(tmp_path / "b", gpu_model_dir, prompt_file)
    crashed = Trainer(load_config(cfg_path))
    crashed.rollout = CrashingRollout(crashed.rollout, fail_at_call=2)
    with pytest.raises(RuntimeError, match="killed while generating"):
        crashed.fit()
    resumed = Trainer(load_config(cfg_path, {"resume": "auto"}))
    assert resumed.start_step == 2
    _assert_rows_match(_rows(resumed.fit()), expected)


def test_a_step_past_the_memory_cap_ends_in_one_line_and_a_full_pool_preempts(tmp_path, gpu_model_dir, prompt_file,
                                                                               monkeypatch, capsys):
    """Under a real per-process cap (gpu_memory_limit_gib 2) and a KV pool of about three sequences:
    step 1 generates 16 samples through preemption (the engine's own recovery: its pool never
    grows) and finishes; in step 2 the RL phase asks the CUDA allocator for more than the cap leaves
    and the run ends with exit 3 and one line naming the step, the phase, the measured peak and the
    cap, with state-1 verified on disk."""
    from oreal_fast import checkpoint as ckpt
    from oreal_fast import trainer as trainer_module
    from oreal_fast.train import OUT_OF_MEMORY_EXIT, main

    with open(os.path.join(gpu_model_dir, "config.json")) as f:
        hf = json.load(f)
    head_dim = hf["hidden_size"] // hf["num_attention_heads"]
    kv_bytes_per_token = hf["num_hidden_layers"] * 2 * hf["num_key_value_heads"] * head_dim * 2  # bf16 K and V
    max_length = 160
    pool_gib = 3 * max_length * kv_bytes_per_token / 2**30
    cfg = write_config(tmp_path, gpu_model_dir, gpu_model_dir, prompt_file, dtype="auto", device="cuda",
                       loss_impl="auto", total_steps=3, checkpoint_interval=1, keep_resume_states=1,
                       filter_trajectory=False, gen_max_new=120, gen_max_length=max_length, actor_freeze_steps=0,
                       debug=False, temperature=1.0, gpu_memory_limit_gib=2.0, kv_cache_gib=pool_gib,
                       val_before_train=False)
    real_rl_phase, calls = trainer_module.rl_phase, []

    def rl_phase_past_the_cap(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # 64 MiB more than the cap leaves, even with every cached block released
            torch.empty(2 * 2**30 - torch.cuda.memory_allocated() + 2**26, dtype=torch.uint8, device="cuda")
        return real_rl_phase(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "rl_phase", rl_phase_past_the_cap)
    with pytest.raises(SystemExit) as e:
        main([cfg])
    err = capsys.readouterr().err
    assert e.value.code == OUT_OF_MEMORY_EXIT and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    with capsys.disabled():
        print(f"\nthe line a user sees: {line}")
    assert line.startswith("out of GPU memory in step 2, phase rl: peak ") and "cap 2 GiB (gpu_memory_limit_gib)" in line
    assert "resume state state-1.pt (1 step(s) done) is on disk" in line
    (run_name,) = os.listdir(tmp_path / "work")
    run = os.path.join(tmp_path / "work", run_name)
    assert ckpt.verify_state(ckpt.state_path(run, 1)) is None
    assert not [n for n in os.listdir(os.path.join(run, "resume")) if "state-2" in n]
    (step1,) = [json.loads(line) for line in open(os.path.join(run, "rank0.log.jsonl"))]
    assert step1["rollout_preemptions"] > 0 and step1["num_rl_tokens"] > 0
