"""``report_to``: each tracker gets the run name, the resolved config and every step's and validation's
metrics, read back here from what the tracker wrote (wandb's offline run files, TensorBoard's event
files, trackio's database) and compared with the run folder's jsonl. A missing package is one config
error at start-up; a tracker that fails at start or mid-run is dropped with one warning while the
jsonl goes on; ``none`` writes no tracker files. CPU only, no network."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from oreal_fast.config import ConfigError, load_config
from oreal_fast.metrics import OFFICIAL_KEYS, MetricsWriter

from base_config import BASE, ROOT
from wandb_files import offline_runs, use_offline_wandb

RUN_NAME = "20260102030405"  # a run folder's name, as RunFolder.create makes it
MISSING_MESSAGE = "{name!r} needs the {name} package, which is not installed: pip install 'oreal-fast[{name}]'"


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    return use_offline_wandb(monkeypatch, str(tmp_path / "wandb-home"))


def _config_file(tmp_path, extra: str = "") -> str:
    path = tmp_path / "cfg.py"
    path.write_text(BASE + extra)
    return str(path)


def _run_dir(tmp_path) -> str:
    path = tmp_path / "work" / RUN_NAME
    path.mkdir(parents=True)
    return str(path)


def step_row(step: int) -> dict:
    """A step's metrics as ``step_record.step_metrics`` shapes them (every official key, then ours);
    floats with long binary expansions, so a value rounded anywhere on the way shows."""
    row = {k: step / 7 + i / 3 for i, k in enumerate(OFFICIAL_KEYS)}
    row.update(step=step, num_rl_tokens=300 + step, infer_tgs=4000 + step, rl_tgs=1200 + step, eta=60 - step,
               num_kept=2 * step, judger_rule_confirmed=step + 1)
    return row


def val_row(step: int) -> dict:
    return {"val_num_problems": 4, "val_greedy_pass1": step / 8 + 1 / 3, "val_time": 0.1 + step / 7}


def write_run(writer: MetricsWriter, steps=(1, 2, 3), validations=(0, 2, 3)) -> None:
    """What the trainer writes: a validation before step 1, the steps, validations after some of them."""
    if 0 in validations:
        writer.write_validation(0, val_row(0))
    for step in steps:
        writer.write(step_row(step), kl_coef=0.01, scheduler_actor_lr=step_row(step)["actor_lr"])
        if step in validations:
            writer.write_validation(step, val_row(step))


def jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def read_tensorboard(run_dir: str) -> tuple[dict[str, list[tuple[int, float]]], dict]:
    """Every scalar series (tag -> [(step, value)]) and the config text entry, parsed back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(run_dir, "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    (text,) = acc.Tensors("config/text_summary")
    config = json.loads(text.tensor_proto.string_val[0].decode())  # JSON indented as a Markdown code block
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}, config


# ----------------------------------------------------------------------------- wandb, offline


def test_wandb_offline_files_hold_the_run_name_the_whole_config_and_every_metric(wandb_offline, tmp_path):
    config = load_config(_config_file(tmp_path), {"report_to": ["wandb"]}).to_dict()
    run_dir = _run_dir(tmp_path)
    writer = MetricsWriter(run_dir, report_to=["wandb"], config=config)
    write_run(writer)
    writer.close()

    (run,) = offline_runs(run_dir)
    assert (run.name, run.project) == (RUN_NAME, "oreal-fast")
    assert run.config == json.loads(json.dumps(config))  # every key, tuples as JSON lists
    assert run.config["report_to"] == ["wandb"] and len(run.config) == len(config)
    # one history row per write, at the trainer's step; exact values, validations included
    assert [r["step"] for r in run.history] == [0, 1, 2, 2, 3, 3]
    steps = [r for r in run.history if "val_time" not in r]
    validations = [r for r in run.history if "val_time" in r]
    assert steps == jsonl(os.path.join(run_dir, "rank0.log.jsonl"))
    assert validations == jsonl(os.path.join(run_dir, "validation.jsonl"))
    assert steps[0]["avg_judger_reward"] == step_row(1)["avg_judger_reward"]  # the jsonl did not round either
    with open(os.path.join(run_dir, "trackers.json")) as f:
        assert json.load(f) == {"wandb": run.run_id}
    assert not os.path.exists(os.path.join(run_dir, "tensorboard"))  # only what report_to names


def test_a_resumed_run_continues_the_same_wandb_run_at_the_trainers_steps(wandb_offline, tmp_path):
    run_dir = _run_dir(tmp_path)
    first = MetricsWriter(run_dir, report_to=["wandb"], config={"seed": 0})
    write_run(first, steps=(1, 2, 3), validations=())  # then a crash; the last resume state is after step 2
    first.close()
    resumed = MetricsWriter(run_dir, report_to=["wandb"], config={"seed": 0})
    resumed.truncate_after(2)
    write_run(resumed, steps=(3, 4), validations=(4,))
    resumed.close()

    before, after = offline_runs(run_dir)
    assert before.run_id == after.run_id and after.name == RUN_NAME
    assert [r["step"] for r in before.history] == [1, 2, 3]
    assert [r["step"] for r in after.history] == [3, 4, 4]  # the trainer's steps, not wandb's count of logs
    assert [r for r in after.history if "val_time" not in r] == jsonl(os.path.join(run_dir, "rank0.log.jsonl"))[2:]


@pytest.mark.parametrize("fails_at", ["start", "step 2"])
def test_a_failing_tracker_is_dropped_with_one_warning_and_the_jsonl_goes_on(wandb_offline, tmp_path, monkeypatch,
                                                                             caplog, fails_at):
    def broken(*args, **kwargs):
        raise RuntimeError("wandb service went away")

    run_dir = _run_dir(tmp_path)
    if fails_at == "start":
        monkeypatch.setattr(wandb_offline, "init", broken)
    with caplog.at_level(logging.WARNING, logger="oreal_fast"):
        writer = MetricsWriter(run_dir, report_to=["tensorboard", "wandb"], config={})
        write_run(writer, steps=(1,), validations=())
        monkeypatch.setattr(wandb_offline.Run, "log", broken)  # every later log call raises
        write_run(writer, steps=(2, 3), validations=(2,))
        writer.close()

    message = (f"tracker wandb failed at {fails_at} (RuntimeError: wandb service went away); it gets nothing more "
               "in this run, the run folder's metrics files go on")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [message]
    with open(os.path.join(run_dir, "rank0.log")) as f:
        assert f"warning: {message}\n" in f.read()
    assert jsonl(os.path.join(run_dir, "rank0.log.jsonl")) == [step_row(s) for s in (1, 2, 3)]
    assert jsonl(os.path.join(run_dir, "validation.jsonl")) == [{"step": 2, **val_row(2)}]
    got_by_wandb = [r["step"] for run in offline_runs(run_dir) for r in run.history]
    assert got_by_wandb == ([] if fails_at == "start" else [1])
    # the other tracker is untouched
    assert [step for step, _ in read_tensorboard(run_dir)[0]["rl_loss"]] == [1, 2, 3]


# ----------------------------------------------------------------------------- TensorBoard, none


def test_tensorboard_by_default_gets_every_step_and_validation_metric(tmp_path):
    config = load_config(_config_file(tmp_path)).to_dict()
    assert config["report_to"] == ["tensorboard"]
    run_dir = _run_dir(tmp_path)
    writer = MetricsWriter(run_dir, config=config)
    write_run(writer)
    writer.close()

    scalars, tb_config = read_tensorboard(run_dir)
    assert tb_config == json.loads(json.dumps(config))
    expected = {k: [] for k in [*step_row(1), *val_row(0)] if k != "step"}
    for row in jsonl(os.path.join(run_dir, "rank0.log.jsonl")) + jsonl(os.path.join(run_dir, "validation.jsonl")):
        for key, value in row.items():
            if key != "step":
                expected[key].append((row["step"], pytest.approx(value, rel=1e-6)))  # TensorBoard keeps fp32
    assert scalars == expected


def test_none_writes_no_tracker_files(tmp_path):
    assert load_config(_config_file(tmp_path, 'report_to = "none"\n')).report_to == ["none"]
    run_dir = _run_dir(tmp_path)
    writer = MetricsWriter(run_dir, report_to=["none"], config={"seed": 0})
    write_run(writer)
    writer.close()
    assert sorted(os.listdir(run_dir)) == ["rank0.log", "rank0.log.jsonl", "validation.jsonl"]


# ----------------------------------------------------------------------------- the config key


@pytest.mark.parametrize("value, expected", [
    ("tensorboard", ["tensorboard"]),
    (["tensorboard", "wandb"], ["tensorboard", "wandb"]),
    (("wandb",), ["wandb"]),
])
def test_report_to_takes_a_name_or_a_list(tmp_path, value, expected):
    if "wandb" in expected:
        pytest.importorskip("wandb")
    assert load_config(_config_file(tmp_path), {"report_to": value}).report_to == expected


@pytest.mark.parametrize("value, why", [
    ("mlflow", "unknown tracker(s) ['mlflow']; allowed: tensorboard, wandb, trackio, none"),
    ([], "expected a tracker name or a non-empty list of them"),
    (["none", "tensorboard"], "lists 'none' with others"),
    (["tensorboard", "tensorboard"], "repeats a tracker"),
    (True, "expected a tracker name or a non-empty list of them"),
])
def test_bad_report_to_names_the_key(tmp_path, value, why):
    path = _config_file(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_config(path, {"report_to": value})
    assert str(e.value).startswith(f"report_to in {path} (set on the command line): ")
    assert why in str(e.value)


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_a_missing_tracker_package_is_one_config_error_naming_the_extra(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # what `import name` sees when it is not installed
    path = _config_file(tmp_path, f"report_to = [{name!r}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"report_to in {path}: " + MISSING_MESSAGE.format(name=name)


def test_no_tracker_package_is_imported_unless_report_to_names_it(tmp_path):
    """Loading a config, then writing with the default tracker, leaves wandb and trackio unimported."""
    probe = (f"import sys\nfrom oreal_fast.config import load_config\nfrom oreal_fast.metrics import MetricsWriter\n"
             f"cfg = load_config({_config_file(tmp_path)!r})\n"
             f"MetricsWriter({_run_dir(tmp_path)!r}, report_to=cfg.report_to, config=cfg.to_dict()).close()\n"
             f"print(sorted(m for m in ('wandb', 'trackio') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ----------------------------------------------------------------------------- trackio

TRACKIO_PROBE = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
from oreal_fast.metrics import MetricsWriter

run_dir, plan = sys.argv[1], json.loads(sys.argv[2])
for session in plan["sessions"]:  # a run, then its resume
    writer = MetricsWriter(run_dir, report_to=["trackio"], config=plan["config"])
    for step, row in session:
        if "val_time" in row:
            writer.write_validation(step, row)
        else:
            writer.write(row, kl_coef=0.01, scheduler_actor_lr=row["actor_lr"])
    writer.close()
logs = [{k: v for k, v in r.items() if k != "timestamp"} for r in SQLiteStorage.get_logs("oreal-fast", plan["name"])]
print("FOUND", json.dumps({"runs": SQLiteStorage.get_runs("oreal-fast"), "logs": logs,
                           "config": SQLiteStorage.get_run_config("oreal-fast", plan["name"])}))
"""


def test_trackio_database_holds_the_config_and_every_metric_and_a_resume_continues_the_run(tmp_path):
    """In a fresh process: trackio fixes its database folder (TRACKIO_DIR) when it is first imported."""
    pytest.importorskip("trackio")
    config = {"seed": 0, "report_to": ["trackio"], "datasets": ["a.jsonl"]}
    sessions = [[(0, val_row(0)), (1, step_row(1)), (2, step_row(2)), (2, val_row(2))], [(3, step_row(3))]]
    plan = json.dumps({"config": config, "sessions": sessions, "name": RUN_NAME})
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1"}
    env.pop("TRACKIO_PROJECT", None)
    run_dir = _run_dir(tmp_path)
    out = subprocess.run([sys.executable, "-c", TRACKIO_PROBE, run_dir, plan], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("FOUND ")]  # trackio prints too
    found = json.loads(line.removeprefix("FOUND "))
    assert found["runs"] == [RUN_NAME]  # the resume went on in the same run
    assert {k: v for k, v in found["config"].items() if not k.startswith("_")} == config
    writes = sessions[0] + sessions[1]
    assert found["logs"] == [{"step": step, **{k: v for k, v in row.items() if k != "step"}} for step, row in writes]
    with open(os.path.join(run_dir, "trackers.json")) as f:
        assert json.load(f) == {"trackio": "oreal-fast"}
