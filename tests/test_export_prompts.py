"""scripts/export_prompts.py: the exported files read back into the records the config's sources give."""

import json
import os
import subprocess
import sys

import pytest

from base_config import BASE, ROOT
from oreal_fast.data.prompts import load_prompt_records

SCRIPT = os.path.join(ROOT, "scripts", "export_prompts.py")


def _export(tmp_path, config_text: str, *args: str) -> subprocess.CompletedProcess:
    config = tmp_path / "cfg.py"
    config.write_text(config_text)
    return subprocess.run([sys.executable, SCRIPT, str(config), str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=300)


def test_reasoning_gym_sets_round_trip(tmp_path):
    pytest.importorskip("reasoning_gym")
    train = {"reasoning_gym": {"chain_sum": 12, "basic_arithmetic": 7}, "seed": 3}
    val = {"reasoning_gym": {"chain_sum": 5}, "seed": 4, "exclude": train}
    proc = _export(tmp_path, BASE + f"datasets = {train!r}\nval_datasets = {val!r}\ndata_difficulty_balance_cfg = None\n")
    assert proc.returncode == 0, proc.stderr
    for name, source, n in (("train", train, 19), ("val", val, 5)):
        path = tmp_path / "out" / f"{name}.jsonl"
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert len(rows) == n and all(set(r) == {"question", "gold_answer"} for r in rows)
        # the trainer reading the file gets the records the generator source gives, in order
        assert load_prompt_records(str(path)) == load_prompt_records(source)
    # the printed overrides name both files
    assert str(tmp_path / "out" / "train.jsonl") in proc.stdout and "--val_datasets" in proc.stdout


def test_overrides_apply_and_no_val_file_without_val_datasets(tmp_path):
    proc = _export(tmp_path, BASE, "--max_prompts", "3")
    assert proc.returncode == 0, proc.stderr
    rows = (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    demo = load_prompt_records("package://oreal_fast/assets/demo_problems.jsonl", max_prompts=3)
    assert [json.loads(r)["question"] for r in rows] == [r.question for r in demo]
    assert not (tmp_path / "out" / "val.jsonl").exists()


def test_bad_source_is_one_line_exit_2(tmp_path):
    proc = _export(tmp_path, BASE + 'datasets = "no/such/file.jsonl"\n')
    assert proc.returncode == 2
    assert proc.stderr.startswith("export_prompts: ") and "no/such/file.jsonl" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
