"""What a new user meets in the first hour, on the tiny model: progress that moves within each phase, the
run folder logged at start with the resolved config saved in it (and kept on resume), data checked before
any model or tokenizer loads, ``pass_rate`` needed only by difficulty balancing, and ``--smoke``."""

from __future__ import annotations

import json
import logging
import os

import pytest

from oreal_fast import runtime
from oreal_fast import trainer as trainer_module
from oreal_fast.config import load_config
from oreal_fast.train import main
from oreal_fast.trainer import Trainer

from trainer_helpers import REWARDS, KeywordRouter, ScriptedRollout, ScriptedRouter, make_tokenizer, write_config

# questions of different lengths, so that under a tight gen_max_length responses end at different steps
QUESTIONS = ["What is 1 + 1?", "What is 12 + 30?", "What is 123 + 456?", "What is 1234 + 5678?",
             "Add 1 and 2.", "Compute 99 + 1 please.", "What do you get from 7 + 7 + 7?", "Sum: 5 + 5"]


def prompts(tmp_path, *, pass_rate: bool = True, name: str = "p.jsonl") -> str:
    path = tmp_path / name
    rows = [{"question": q, "gold_answer": "2", **({"pass_rate": 0.25} if pass_rate else {})} for q in QUESTIONS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def runs(events, phase):
    """The event lists of each run of ``phase`` (a run begins where the phase starts)."""
    out = []
    for e in events:
        if e.phase == phase:
            if e.total is None and e.done == 0 and e.tokens == 0 and (not out or out[-1][-1].phase != phase
                                                                      or out[-1][-1].total is not None):
                out.append([])
            out[-1].append(e)
    return out


def assert_moves(run, total):
    """After the phase starts and its total is known, every report adds work, up to the total."""
    assert run[0].total is None and run[1].total == total
    reports = run[2:]
    assert len(reports) >= 2
    assert all(b.tokens > a.tokens or b.done > a.done for a, b in zip(run[1:], reports))
    assert all(b.done >= a.done for a, b in zip(run[1:], reports))
    assert reports[-1].done == total


def test_progress_moves_within_generate_validate_and_the_rl_phase(tmp_path, tiny_model_dir, perturbed_actor_dir):
    file = prompts(tmp_path)
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, file, total_steps=2,
                                   gen_max_new=30, gen_max_length=64, rl_micro_batch_tokens=64,
                                   val_datasets=file, val_before_train=True, val_max_problems=4,
                                   keep_resume_states=0, checkpoint_interval=-1))
    trainer = Trainer(cfg, router=ScriptedRouter(REWARDS))  # the real plain sampler generates
    events = []
    trainer.progress.subscribe(events.append)
    run_dir = trainer.fit()
    with open(os.path.join(run_dir, "rank0.log.jsonl")) as f:
        steps = [json.loads(line) for line in f]

    generate = runs(events, "generate")
    assert len(generate) == 2
    for run, metrics in zip(generate, steps):
        assert_moves(run, cfg.gen_global_batch)
        assert len({e.done for e in run}) >= 3  # responses finish at different steps, and it shows
        assert run[-1].tokens == round(metrics["avg_new_tokens"] * cfg.gen_global_batch)
    validate = runs(events, "validate")
    assert len(validate) == 2  # before step 1 and after the last
    for run in validate:
        assert_moves(run, 4)
    rl = runs(events, "rl")
    assert len(rl) == 2
    for run, metrics in zip(rl, steps):
        assert run[1].unit == "micro-batches"
        assert [e.done for e in run[1:]] == list(range(run[1].total + 1))
        assert run[-1].tokens == metrics["num_rl_tokens"]


def test_run_folder_is_logged_and_the_resolved_config_saved_and_kept_on_resume(tmp_path, tiny_model_dir, caplog):
    path = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompts(tmp_path), total_steps=4)
    tok = make_tokenizer()

    def fit(overrides):
        cfg = load_config(path, overrides)
        rollout = ScriptedRollout(tok, ["yes 2", "no"], tok.convert_tokens_to_ids("<|im_end|>"))
        return cfg, Trainer(cfg, rollout=rollout, router=KeywordRouter()).fit()

    with caplog.at_level(logging.INFO, logger="oreal_fast"):
        cfg, run_dir = fit({"total_steps": 2, "seed": 3})
    assert f"run folder: {run_dir} (new); resolved config: {os.path.join(run_dir, 'config.py')}" in caplog.messages
    saved = os.path.join(run_dir, "config.py")
    assert {**load_config(saved).to_dict(), "config_path": ""} == {**cfg.to_dict(), "config_path": ""}
    with open(saved) as f:
        first = f.read()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="oreal_fast"):
        resumed, again = fit({"total_steps": 3, "seed": 3, "resume": run_dir})
    assert again == run_dir
    resumed_file = os.path.join(run_dir, "config.resume-2.py")
    assert f"run folder: {run_dir} (resumed); resolved config: {resumed_file}" in caplog.messages
    with open(saved) as f:
        assert f.read() == first  # the first invocation's config stays
    assert {**load_config(resumed_file).to_dict(), "config_path": ""} == {**resumed.to_dict(), "config_path": ""}
    assert (load_config(resumed_file).total_steps, load_config(resumed_file).resume) == (3, run_dir)


@pytest.fixture
def loaders(monkeypatch):
    """Records every tokenizer and model load the run asks for."""
    calls = []
    for name in ("load_tokenizer", "load_decoder", "load_token_rm"):
        real = getattr(runtime, name)
        monkeypatch.setattr(runtime, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    return calls


@pytest.mark.parametrize("case", ["bad_row", "no_pass_rate_with_balancing", "bad_held_out"])
def test_a_data_error_stops_before_any_tokenizer_or_model_loads(tmp_path, tiny_model_dir, loaders, capsys, caplog,
                                                                 case):
    good = prompts(tmp_path, pass_rate=case != "no_pass_rate_with_balancing")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Q1", "gold_answer": "1", "pass_rate": 0.25}\n{"question": "Q2"}\n')
    extra = {"bad_row": dict(datasets=str(bad)),
             "no_pass_rate_with_balancing": dict(data_difficulty_balance_cfg=[((0.0, 1.0), 1)]),
             "bad_held_out": dict(val_datasets=str(bad))}[case]
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, good, **extra)
    with caplog.at_level(logging.INFO, logger="oreal_fast"), pytest.raises(SystemExit) as e:
        main([cfg])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    expected = {"bad_row": f"data error: {bad}:2: field 'gold_answer' is missing; the row has fields question",
                "no_pass_rate_with_balancing": "data error: 8 of 8 prompt records have no pass_rate (first: "
                                               "'What is 1 + 1?'); difficulty balancing (data_difficulty_balance_cfg) "
                                               "needs one per record: add a pass_rate field, or set "
                                               "data_difficulty_balance_cfg = None",
                "bad_held_out": f"data error: {bad}:2: field 'gold_answer' is missing; the row has fields question"}
    assert err == expected[case]
    assert loaders == []
    assert any(m.startswith("reading the prompts: datasets = ") for m in caplog.messages)
    assert not os.path.exists(tmp_path / "work")


def test_pass_rate_is_optional_without_balancing_and_what_loads_is_logged(tmp_path, tiny_model_dir, loaders, caplog):
    path = write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompts(tmp_path, pass_rate=False), total_steps=2)
    tok = make_tokenizer()
    rollout = ScriptedRollout(tok, ["yes 2", "no"], tok.convert_tokens_to_ids("<|im_end|>"))
    with caplog.at_level(logging.INFO, logger="oreal_fast"):
        Trainer(load_config(path), rollout=rollout, router=KeywordRouter()).fit()
    assert "prompts: 8 records (no balancing)" in caplog.messages
    loading = [m.split(" (")[0] for m in caplog.messages if m.startswith("loading ")]
    assert loading == [f"loading the tokenizer of actor {tiny_model_dir}", f"loading actor {tiny_model_dir}",
                       f"loading reference {tiny_model_dir}", f"loading token_level_rm {tiny_model_dir}"]
    assert loaders == ["load_tokenizer", "load_decoder", "load_decoder", "load_token_rm"]


def test_smoke_is_one_step_without_validation_or_resume_state(tmp_path, tiny_model_dir, monkeypatch, caplog):
    file = prompts(tmp_path)
    monkeypatch.setattr(trainer_module, "Router", lambda *args, **kwargs: ScriptedRouter(REWARDS))
    cfg = write_config(tmp_path, tiny_model_dir, tiny_model_dir, file, warmup_steps=10, total_steps=90,
                       val_datasets=file, val_before_train=True, val_interval=1)
    with caplog.at_level(logging.INFO, logger="oreal_fast"):
        main([cfg, "--smoke"])
    (name,) = os.listdir(tmp_path / "work")
    run_dir = tmp_path / "work" / name
    with open(run_dir / "rank0.log.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1]
    assert os.path.isdir(run_dir / "hf-1")
    assert not os.path.exists(run_dir / "validation.jsonl")
    assert not os.path.exists(run_dir / "resume") or os.listdir(run_dir / "resume") == []
    saved = load_config(str(run_dir / "config.py"))
    assert (saved.total_steps, saved.val_datasets, saved.keep_resume_states, saved.warmup_steps) == (1, None, 0, 10)
    assert any(m.startswith(f"run folder: {run_dir} (new)") for m in caplog.messages)
