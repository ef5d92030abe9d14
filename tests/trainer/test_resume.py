"""Resume: a run that crashes after its step-2 checkpoint and is resumed logs the same steps 3-4 as
a run that never stopped (same seed, CPU, deterministic); the newest state is verified before it is
trusted; only the newest ``keep_resume_states`` states stay; ``total_steps`` may grow on resume."""

from __future__ import annotations

import json
import os

import pytest
import torch

from oreal_fast import checkpoint as ckpt
from oreal_fast.config import ConfigError, load_config
from oreal_fast.metrics import reproducible_metrics
from oreal_fast.recompute import activation_bytes_per_token
from oreal_fast.trainer import Trainer

from trainer_helpers import KeywordRouter, ScriptedRollout, make_tokenizer, write_config

TEXTS = ["yes, 2", "no", "yes it is 4", "not sure", "the answer is no", "yes!"]
def run(cfg, fail_at_call=None) -> str:
    tok = make_tokenizer()
    rollout = ScriptedRollout(tok, TEXTS, tok.convert_tokens_to_ids("<|im_end|>"), fail_at_call=fail_at_call)
    trainer = Trainer(cfg, rollout=rollout, router=KeywordRouter())
    return trainer.fit()


def rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "rank0.log.jsonl")) as f:
        return [reproducible_metrics(json.loads(line)) for line in f]


def text_log(run_dir: str) -> str:
    with open(os.path.join(run_dir, "rank0.log")) as f:
        return f.read()


def crashed_run(tmp_path, tiny_model_dir, prompt_file, name="b", **extra) -> tuple[str, str]:
    """A run that dies generating step 3, after the hf-2 checkpoint: (config path, run folder)."""
    (tmp_path / name).mkdir()
    cfg_path = write_config(tmp_path / name, tiny_model_dir, tiny_model_dir, prompt_file, actor_freeze_steps=1,
                            checkpoint_interval=1, **extra)
    with pytest.raises(RuntimeError, match="scripted crash"):
        run(load_config(cfg_path), fail_at_call=2)
    (run_dir,) = [os.path.join(tmp_path / name / "work", d) for d in os.listdir(tmp_path / name / "work")]
    return cfg_path, run_dir


@pytest.fixture(scope="module")
def expected(tmp_path_factory, tiny_model_dir):
    """The metrics of a straight 4-step run."""
    folder = tmp_path_factory.mktemp("straight")
    prompts = folder / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"What is {a} + {a}?", "gold_answer": str(2 * a),
                                           "pass_rate": 0.25}) + "\n" for a in range(1, 9)))
    straight = load_config(write_config(folder, tiny_model_dir, tiny_model_dir, str(prompts), actor_freeze_steps=1,
                                        checkpoint_interval=1))
    result = rows(run(straight))
    assert len(result) == 4 and any(r["num_kept"] > 0 for r in result[2:])
    return str(prompts), result


def test_resumed_run_matches_uninterrupted_run(tmp_path, tiny_model_dir, expected):
    prompts, straight = expected
    cfg_path, run_dir = crashed_run(tmp_path, tiny_model_dir, prompts)
    # keep_resume_states = 2: state-1 was removed once state-2 was complete
    assert sorted(os.listdir(os.path.join(run_dir, "resume"))) == ["state-1.json", "state-1.pt",
                                                                   "state-2.json", "state-2.pt"]
    resumed_dir = run(load_config(cfg_path, {"resume": "auto"}))
    assert resumed_dir == run_dir
    assert rows(resumed_dir) == straight
    assert sorted(d for d in os.listdir(resumed_dir) if d.startswith("hf-")) == ["hf-1", "hf-2", "hf-3", "hf-4"]
    assert sorted(os.listdir(os.path.join(run_dir, "resume"))) == ["state-3.json", "state-3.pt",
                                                                   "state-4.json", "state-4.pt"]
    assert f"resumed from {ckpt.state_path(run_dir, 2)} at step 3" in text_log(run_dir)


def test_a_truncated_newest_state_falls_back_to_the_one_before_and_total_steps_may_grow(
        tmp_path, tiny_model_dir, expected):
    prompts, straight = expected  # steps 3 and 4 are on the cosine, whose length total_steps sets
    cfg_path, run_dir = crashed_run(tmp_path, tiny_model_dir, prompts, total_steps=3)
    newest = ckpt.state_path(run_dir, 2)
    size = os.path.getsize(newest)
    os.truncate(newest, size // 2)
    # interrupted writes of an earlier process: removed at the next start, with what they freed
    with open(newest + ".tmp-99999", "wb") as f:
        f.write(bytes(3 << 20))
    os.mkdir(os.path.join(run_dir, "hf-3.tmp-99999"))

    run(load_config(cfg_path, {"resume": "auto", "total_steps": 4}))
    log = text_log(run_dir)
    assert (f"state-2: state-2.pt has {size // 2} bytes, its manifest says {size}); resuming from state-1.pt "
            "instead") in log
    assert "removed 2 partial file(s) left by an interrupted write, 3.0 MiB freed: hf-3.tmp-99999, " \
           "resume/state-2.pt.tmp-99999" in log
    assert "total_steps is 4, the saved run planned 3: LR schedules recomputed for 4 steps" in log
    assert f"resumed from {ckpt.state_path(run_dir, 1)} at step 2" in log
    assert rows(run_dir) == straight
    assert not [n for n in os.listdir(os.path.join(run_dir, "resume")) if ".tmp-" in n]


@pytest.mark.parametrize("damage", ["delete", "flip"])
def test_no_state_that_verifies_is_a_config_error_naming_each_fault(tmp_path, tiny_model_dir, expected, damage):
    prompts, _ = expected
    cfg_path, run_dir = crashed_run(tmp_path, tiny_model_dir, prompts, keep_resume_states=1)
    path = ckpt.state_path(run_dir, 2)
    if damage == "delete":
        os.remove(path)
        why = "state-2.pt is missing"
    else:
        with open(path, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))
        why = "state-2.pt does not match its manifest's SHA-256"
    with pytest.raises(ConfigError) as e:
        run(load_config(cfg_path, {"resume": run_dir}))
    assert str(e.value) == (f"resume in {cfg_path}: {os.path.join(run_dir, 'resume')}: no resume state verifies "
                            f"(state-2: {why})")


def test_keep_zero_writes_no_state_and_resume_auto_starts_a_new_run(tmp_path, tiny_model_dir, expected):
    prompts, straight = expected
    cfg_path = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompts, actor_freeze_steps=1,
                            checkpoint_interval=1, keep_resume_states=0, total_steps=2)
    run_dir = run(load_config(cfg_path, {"resume": "auto"}))
    assert not os.path.exists(os.path.join(run_dir, "resume"))
    assert sorted(d for d in os.listdir(run_dir) if d.startswith("hf-")) == ["hf-1", "hf-2"]
    log = text_log(run_dir)
    assert f"no resume state under {tmp_path / 'work'}; starting a new run" in log
    assert rows(run_dir) == straight[:2]
    # the text line shows the scheduler LR of the frozen step 1, as the official one does, and says so
    assert "[Step 1] step: 1 actor_lr: 0.0010 (scheduler; actor frozen, not applied) actor_grad_norm" in log
    assert "[Step 2] step: 2 actor_lr: 0.0010 actor_grad_norm" in log


class SizedRollout(ScriptedRollout):
    """A scripted rollout whose memory state grows each step, as a resized KV pool's would."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state, self.loaded = {}, []

    def fit_memory(self, peak_gib):
        self.state = {"pool_bytes": self.state.get("pool_bytes", 0) + 1000, "need_bytes": 7}

    def memory_state(self):
        return dict(self.state)

    def load_memory_state(self, state):
        self.loaded.append(dict(state))
        self.state = dict(state)


def test_a_resumed_run_gives_its_rollout_the_memory_state_of_the_step_it_resumes_after(tmp_path, tiny_model_dir,
                                                                                       prompt_file):
    cfg_path = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, actor_freeze_steps=0,
                            filter_trajectory=False, checkpoint_interval=1, total_steps=3)
    tok = make_tokenizer()
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    straight = SizedRollout(tok, TEXTS, stop)
    Trainer(load_config(cfg_path), rollout=straight, router=KeywordRouter()).fit()
    assert straight.loaded == [{}]  # a fresh run: nothing to load
    assert straight.state == {"pool_bytes": 3000, "need_bytes": 7}  # resized after each of 3 trained steps
    (run_dir,) = [os.path.join(tmp_path / "work", d) for d in os.listdir(tmp_path / "work")]
    assert torch.load(ckpt.state_path(run_dir, 2), weights_only=False)["rollout_memory"] == {
        "pool_bytes": 2000, "need_bytes": 7}
    os.remove(ckpt.state_path(run_dir, 3))  # resume after step 2
    os.remove(ckpt.state_path(run_dir, 3).replace(".pt", ".json"))
    resumed = SizedRollout(tok, TEXTS, stop)
    Trainer(load_config(cfg_path, {"resume": run_dir}), rollout=resumed, router=KeywordRouter()).fit()
    assert resumed.loaded == [{"pool_bytes": 2000, "need_bytes": 7}]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings from Linux's /proc")
def test_a_resume_state_is_mapped_from_its_file_and_unmapped_with_its_tensors(tmp_path):
    """Its tensors are not read into the heap (16 bytes per trained parameter): the file is mapped
    while they live and unmapped when they go, as they do once copied into the GPU models."""
    path = str(tmp_path / "state-1.pt")
    torch.save({"actor": {"w": torch.arange(4096.0)}, "next_step": 1}, path)

    def mapped() -> bool:
        with open("/proc/self/maps") as f:
            return any(path in line for line in f)

    state = ckpt.load_resume_state(path)
    assert mapped() and torch.equal(state["actor"]["w"], torch.arange(4096.0))
    del state
    assert not mapped()


class PeakRollout(ScriptedRollout):
    """A scripted rollout that records the peaks each `fit_memory` call is given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.peaks = []

    def fit_memory(self, peak_gib):
        self.peaks.append(dict(peak_gib))


def test_the_pool_is_sized_from_the_rl_peak_grown_to_a_full_micro_batch(tmp_path, tiny_model_dir, prompt_file):
    """Every kept trajectory in one micro-batch of a 4096-token budget: the rollout is told the step's
    measured RL peak plus the activations of the 4096 - num_rl_tokens tokens the micro-batch was short of."""
    cfg_path = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, filter_trajectory=False,
                            rl_micro_batch_tokens=4096, total_steps=2)
    tok = make_tokenizer()
    rollout = PeakRollout(tok, TEXTS, tok.convert_tokens_to_ids("<|im_end|>"))
    trainer = Trainer(load_config(cfg_path), rollout=rollout, router=KeywordRouter())
    with open(os.path.join(trainer.fit(), "rank0.log.jsonl")) as f:
        logged = [json.loads(line) for line in f]
    models = trainer.models
    per_token = max(activation_bytes_per_token(m, torch.float32) for m in (models.actor, models.token_rm.backbone))
    assert len(rollout.peaks) == len(logged) == 2
    for peaks, row in zip(rollout.peaks, logged):
        assert 0 < row["num_rl_tokens"] < 4096
        assert peaks["gen"] == row["max_memory_gen"]
        assert peaks["rl"] == pytest.approx(row["max_memory_rl"] + per_token * (4096 - row["num_rl_tokens"]) / 2**30)
