"""scripts/evidence.py report: the tables and figure of docs/evidence.md's GPU section, from run
folders written here by hand (seeds and a control, 5 held-out problems, 2 samples each), checked
against numbers worked out by hand; a missing or foreign folder is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "evidence.py")
QUESTIONS = [f"What is {a} + {a}?" for a in range(5)]
GPU_LINE = ("run {d}: config configs/evidence_gpu.py, 2 steps, device cuda:0 (NVIDIA H100 80GB HBM3), "
            "compute torch.bfloat16, LM-head kernels linear_logprob (triton)\n")


def _load():
    spec = importlib.util.spec_from_file_location("evidence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def write_run(run_dir, validations: dict[int, tuple[list[int], list[int]]], rewards, lengths, times, val_times,
              log: str | None = None) -> None:
    """A run folder as the trainer writes it: ``validations`` maps a step to (greedy verdicts,
    correct samples of 2) per problem; the logged interval of a value v is [v / 2, (1 + v) / 2]."""
    _jsonl(os.path.join(run_dir, "rank0.log.jsonl"),
           [{"step": i + 1, "avg_judger_reward": r, "avg_new_tokens": n, "total_time": t}
            for i, (r, n, t) in enumerate(zip(rewards, lengths, times))])
    rows = []
    for (step, (greedy, correct)), val_time in zip(validations.items(), val_times):
        g, m = sum(greedy) / 5, sum(correct) / 10
        rows.append({"step": step, "val_num_problems": 5, "val_greedy_pass1": g, "val_sampled_pass1": m,
                     "val_pass_at_k": 0.5, "val_greedy_pass1_low": g / 2, "val_greedy_pass1_high": (1 + g) / 2,
                     "val_sampled_pass1_low": m / 2, "val_sampled_pass1_high": (1 + m) / 2, "val_time": val_time})
        _jsonl(os.path.join(run_dir, "validation_problems", f"step-{step}.jsonl"),
               [{"question": q, "greedy_correct": bool(v), "num_correct": c, "num_samples": 2}
                for q, v, c in zip(QUESTIONS, greedy, correct)])
    _jsonl(os.path.join(run_dir, "validation.jsonl"), rows)
    if log is not None:
        with open(os.path.join(run_dir, "rank0.log"), "w", encoding="utf-8") as f:
            f.write(log)


@pytest.fixture
def out_dir(tmp_path):
    """seed1 (a work_dir holding one run folder, started twice on an H100), seed2 (a run folder with
    a validation in between and no text log) and the control lr0 (its log names no GPU)."""
    seed1 = tmp_path / "runs" / "seed1" / "20260101-000000"
    write_run(seed1, {0: ([0, 1, 0, 0, 0], [0, 1, 1, 0, 0]), 2: ([1, 1, 1, 0, 0], [2, 1, 2, 1, 0])},
              rewards=[-0.5, 0.25], lengths=[100, 80], times=[10.0, 11.4], val_times=[3.0, 4.2],
              log=GPU_LINE.format(d=seed1) + "[Step 1] ...\n" + GPU_LINE.format(d=seed1))
    write_run(tmp_path / "runs" / "seed2",
              {0: ([0, 1, 0, 0, 0], [0, 1, 1, 0, 0]), 1: ([0, 0, 0, 0, 0], [0, 0, 0, 0, 0]),
               2: ([0, 1, 1, 0, 0], [1, 1, 1, 1, 0])},
              rewards=[-0.75, -0.5], lengths=[120, 130], times=[9.0, 9.0], val_times=[2.0, 2.0, 2.0])
    write_run(tmp_path / "runs" / "lr0", {0: ([0, 1, 0, 0, 0], [0, 1, 1, 0, 0]), 2: ([0, 0, 0, 0, 0], [0, 1, 2, 0, 0])},
              rewards=[-0.5, -0.5], lengths=[100, 101], times=[8.0, 8.0], val_times=[3.0, 3.0],
              log="run x: config c, 2 steps, device cpu, compute torch.float32\n")
    return tmp_path / "runs"


def test_report_prints_the_tables_and_paired_gains_worked_out_by_hand(out_dir, tmp_path, capsys):
    png = tmp_path / "fig.png"
    _load().report(str(out_dir), gpu="NVIDIA H200", png=str(png))
    lines = capsys.readouterr().out.splitlines()
    # Paired gains, last - first per problem, mean +- 1.96 x sample sd / sqrt(5), in points:
    #   seed1 greedy d = 1,0,1,0,0: mean .4, var .3, se sqrt(.06) = .2449, half .4801
    #   seed1 mean@2 d = 1,0,.5,.5,0: mean .4, var .175, se sqrt(.035) = .1871, half .3667
    #   seed2 greedy d = 0,0,1,0,0: mean .2, var .2, se .2, half .3920
    #   seed2 mean@2 d = .5,0,0,.5,0: mean .2, var .075, se sqrt(.015) = .1225, half .2400
    #   lr0   greedy d = 0,-1,0,0,0: mean -.2, half .3920; mean@2 d = 0,0,.5,0,0: mean .1, var .05, half .1960
    # cells: the logged value [v / 2, (1 + v) / 2]; seed2's extra validation after step 1 only in its row
    assert lines[:8] == [
        "| run | held-out | step 0 | step 1 | step 2 | gain, first → last |",
        "|---|---|---|---|---|---|",
        "| seed1 | greedy pass@1 | 20.0 [10.0, 60.0] | – | 60.0 [30.0, 80.0] | +40.0 [-8.0, +88.0] |",
        "| seed1 | mean@2 | 20.0 [10.0, 60.0] | – | 60.0 [30.0, 80.0] | +40.0 [+3.3, +76.7] |",
        "| seed2 | greedy pass@1 | 20.0 [10.0, 60.0] | 0.0 [0.0, 50.0] | 40.0 [20.0, 70.0] | +20.0 [-19.2, +59.2] |",
        "| seed2 | mean@2 | 20.0 [10.0, 60.0] | 0.0 [0.0, 50.0] | 40.0 [20.0, 70.0] | +20.0 [-4.0, +44.0] |",
        "| lr0 | greedy pass@1 | 20.0 [10.0, 60.0] | – | 0.0 [0.0, 50.0] | -20.0 [-59.2, +19.2] |",
        "| lr0 | mean@2 | 20.0 [10.0, 60.0] | – | 30.0 [15.0, 65.0] | +10.0 [-9.6, +29.6] |",
    ]
    # the first and last tenth of 2 steps are one step each; time = sum of total_time + sum of val_time;
    # seed1's log names its GPU (twice: a resumed run), the others take --gpu
    assert lines[9:14] == [
        "| run | steps | train reward, first → last tenth of steps | response length (tokens), same steps "
        "| time: steps + validations | GPU |",
        "|---|---|---|---|---|---|",
        "| seed1 | 2 | -0.50 → +0.25 | 100 → 80 | 21 + 7 s | NVIDIA H100 80GB HBM3 |",
        "| seed2 | 2 | -0.75 → -0.50 | 120 → 130 | 18 + 6 s | NVIDIA H200 |",
        "| lr0 | 2 | -0.50 → -0.50 | 100 → 101 | 16 + 6 s | NVIDIA H200 |",
    ]
    # seeds' mean per problem, greedy: .5,0,1,0,0 (mean .3, var .2, half .3920); minus lr0's:
    #   .5,1,1,0,0 (mean .5, var .25, se sqrt(.05) = .2236, half .4383); seeds' sd of 40 and 20: 14.1
    # mean@2: .75,0,.25,.5,0 (mean .3, var .10625, se .1458, half .2857); minus lr0's:
    #   .75,0,-.25,.5,0 (mean .2, var .16875, se .1837, half .3601)
    assert lines[15:21] == [
        "Gain from the first to the last validation, points [paired 95 % interval over 5 problems]:",
        "",
        "| held-out | seeds' mean (seed1, seed2; standard deviation) | lr0 | seeds − lr0 |",
        "|---|---|---|---|",
        "| greedy pass@1 | +30.0 [-9.2, +69.2] (14.1) | -20.0 [-59.2, +19.2] | +50.0 [+6.2, +93.8] |",
        "| mean@2 | +30.0 [+1.4, +58.6] (14.1) | +10.0 [-9.6, +29.6] | +20.0 [-16.0, +56.0] |",
    ]
    assert lines[-1] == f"wrote {png}" and png.stat().st_size > 10_000


def test_groups_count_greedy_problems_right_per_question_prefix(out_dir, tmp_path, capsys):
    _load().report(str(out_dir), png=str(tmp_path / "fig.png"), groups="zero=What is 0 ,one=What is 1 ,rest=")
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("Held-out greedy problems right, first → last validation (of the group's problems):")
    # greedy verdicts per problem, first / last validation: seed1 01000 / 11100, seed2 01000 / 01100,
    # lr0 01000 / 00000; problems 2-4 fall to the empty prefix
    assert lines[start + 2:start + 7] == [
        "| run | zero (1) | one (1) | rest (3) |",
        "|---|---|---|---|",
        "| seed1 | 0 → 1 | 1 → 1 | 0 → 1 |",
        "| seed2 | 0 → 0 | 1 → 1 | 0 → 1 |",
        "| lr0 | 0 → 0 | 1 → 0 | 0 → 0 |",
    ]
    with pytest.raises(ValueError, match="NAME=QUESTION_PREFIX"):
        _load().parse_groups("zero")


def test_explicit_runs_keep_their_order_and_need_the_same_problems(out_dir, tmp_path, capsys):
    evidence = _load()
    evidence.report(runs=f"lr0={out_dir / 'lr0'},seed2={out_dir / 'seed2'}", png=str(tmp_path / "f.png"))
    out = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ")[0] for line in out if line.startswith(("| lr0", "| seed"))]
    assert rows == ["| lr0", "| lr0", "| seed2", "| seed2", "| lr0", "| seed2"]  # held-out table, runs' table
    other = tmp_path / "other"
    write_run(other, {0: ([0] * 5, [0] * 5), 2: ([1] * 5, [0] * 5)}, [0.0], [1], [1.0], [1.0, 1.0])
    _jsonl(os.path.join(other, "validation_problems", "step-0.jsonl"),  # a different first problem
           [{"question": "?", "greedy_correct": False, "num_correct": 0, "num_samples": 2}] * 5)
    with pytest.raises(SystemExit) as e:
        evidence.report(runs=f"seed1={other}", png=str(tmp_path / "f.png"))
    assert e.value.code == 2
    why = "run seed1: its first and last validations hold different problems"
    assert capsys.readouterr().err == f"evidence report: {why}\n"


def _report_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "report", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["missing", "foreign", "no_intervals", "no_problem_file"])
def test_a_missing_or_foreign_folder_is_one_line_and_exit_2(out_dir, tmp_path, case):
    seed1 = out_dir / "seed1" / "20260101-000000"
    if case == "missing":
        target, why = tmp_path / "nowhere", f"{tmp_path / 'nowhere'}: no such folder"
    elif case == "foreign":
        (out_dir / "notes").mkdir()
        (out_dir / "notes" / "readme.txt").write_text("not a run")
        target, why = out_dir, f"{out_dir / 'notes'}: no rank0.log.jsonl here or in a run folder below it"
    elif case == "no_intervals":  # a validation row of an oreal-fast that logged no intervals
        rows = [json.loads(line) for line in (seed1 / "validation.jsonl").read_text().splitlines()]
        _jsonl(seed1 / "validation.jsonl", [{k: v for k, v in r.items() if "_low" not in k} for r in rows])
        target, why = out_dir, (f"{seed1}/validation.jsonl: the validation after step 0 has no "
                                "'val_greedy_pass1_low' (greedy-only, or from an oreal-fast that logged no intervals)")
    else:
        os.remove(out_dir / "lr0" / "validation_problems" / "step-2.jsonl")
        target, why = out_dir, (f"{out_dir / 'lr0' / 'validation_problems' / 'step-2.jsonl'}: missing "
                                "(validations of an oreal-fast that wrote no per-problem file?)")
    proc = _report_cli(str(target), "--png", str(tmp_path / "f.png"))
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"evidence report: {why}\n", "")
    assert not (tmp_path / "f.png").exists()


def test_keep_copies_what_report_reads_and_report_prints_the_same(out_dir, tmp_path, capsys):
    evidence = _load()
    evidence.report(str(out_dir), gpu="NVIDIA H200", png=str(tmp_path / "a.png"))
    full = capsys.readouterr().out.splitlines()[:-1]  # all but "wrote ..."
    evidence.keep(str(out_dir), str(tmp_path / "kept"))
    capsys.readouterr()
    evidence.report(str(tmp_path / "kept"), gpu="NVIDIA H200", png=str(tmp_path / "b.png"))
    assert capsys.readouterr().out.splitlines()[:-1] == full
    # seed2 validated after steps 0, 1 and 2: only the first and last problem files are kept
    assert sorted(os.listdir(tmp_path / "kept" / "seed2" / "validation_problems")) == ["step-0.jsonl", "step-2.jsonl"]
    # seed1's log: its two start lines, with the run's name for its folder and the config's file name
    with open(tmp_path / "kept" / "seed1" / "rank0.log", encoding="utf-8") as f:
        assert f.read() == 2 * GPU_LINE.format(d="seed1").replace("configs/evidence_gpu.py", "evidence_gpu.py")
    assert not os.path.exists(tmp_path / "kept" / "seed2" / "rank0.log")  # it had none


@pytest.mark.parametrize("sitting", ["h100_2026-12-07_corrected", "h100_2026-12-07_expression"])
def test_the_committed_gpu_runs_give_the_tables_in_evidence_md(tmp_path, sitting):
    """docs/evidence.md's tables of each GPU sitting are what ``report`` prints from its committed run folder."""
    runs = os.path.join(ROOT, "docs", "evidence_runs", sitting)
    groups = ("basic_arithmetic=Calculate ,chain_sum=State the final answer,"
              "products=Solve the following multiplication,gsm_symbolic=")
    out = subprocess.run([sys.executable, SCRIPT, "report", runs, "--gpu", "NVIDIA H100 80GB HBM3",
                          "--png", str(tmp_path / "fig.png"), "--groups", groups],
                         capture_output=True, text=True, check=True).stdout
    tables = [line for line in out.splitlines() if line.startswith("|")]
    assert len(tables) == 2 + 10 + 2 + 5 + 2 + 2 + 2 + 5  # held-out (5 runs x 2 metrics), runs, gains, groups
    with open(os.path.join(ROOT, "docs", "evidence.md"), encoding="utf-8") as f:
        doc = f.read().splitlines()
    assert [line for line in tables if line not in doc] == []
    assert os.path.getsize(tmp_path / "fig.png") > 0
