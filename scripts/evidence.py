"""The tables and figures of docs/evidence.md, from run folders.

    python scripts/evidence.py run    OUT_DIR [--seeds 0,1,2]   # CPU section: trains configs/demo_long.py per seed
    python scripts/evidence.py gpu    OUT_DIR [--seconds S] [--cap_gib G] [--names seed1,lr0] [--extra="--KEY V ..."]
    python scripts/evidence.py plot   OUT_DIR [--png docs/evidence.png]
    python scripts/evidence.py report OUT_DIR [--gpu NAME] [--png docs/evidence_gpu.png] [--groups NAME=PREFIX,...]
    python scripts/evidence.py report --runs seed1=DIR,seed2=DIR,lr0=DIR [...]
    python scripts/evidence.py keep   OUT_DIR DEST                # what `report` reads, for docs/evidence_runs/

``run`` starts ``python -m oreal_fast.train configs/demo_long.py --seed S --work_dir OUT_DIR/seedS``
for each seed and appends ``{"seed", "wall_s", "rc"}`` to ``OUT_DIR/times.jsonl`` as each finishes.
``gpu`` starts the GPU section's five runs of ``configs/evidence_gpu.py`` side by side on one GPU
(``GPU_RUNS``: three seeds and the two controls), each in ``OUT_DIR/NAME`` with its log in
``OUT_DIR/NAME.log`` and at most ``cap_gib`` of GPU memory, each resumed (``--resume auto``) when its
folder holds a resume state; ``extra`` is added to every command (the model's path, exported
problem files). After ``seconds`` each run still going gets SIGTERM (it stops at its next safe
point and writes a resume state; SIGKILL after ``GRACE_S``), so a run longer than one sitting
continues with the same command. It prints each run's steps done and exit code, and for a run that
failed on its own the last line of its log (the trainer's one-line reason).

``plot`` reads each seed's run folder (``validation.jsonl`` and ``rank0.log.jsonl``), draws
held-out greedy accuracy, train reward and response length against the step, and prints the
Markdown table of the CPU section (accuracy at each validation, train reward over thirds of the
run, response length of the first and last 4 steps, wall time).

``report`` is for runs that validate with samples and log intervals (``configs/evidence_gpu.py``):
the runs are the sub-folders of OUT_DIR (or ``--runs``, in that order); a name ``seed<N>`` is a seed,
any other name (``lr0``, ``shuffled``) a control. It prints the held-out table (greedy pass@1 and
mean@n at each validation with the logged 95 % intervals, and each run's gain from its first to its
last validation with a paired interval over the same problems, from ``validation_problems/``), the
runs' table (train reward, response length, time, GPU) and the seeds' mean gain against each
control's, and draws held-out accuracy (with interval bands), train reward and response length.
``--groups`` adds, per run and group of problems (named by the opening words of their questions),
the greedy problems right at the first and the last validation.
A missing or foreign folder is one line on stderr and exit 2.

``keep`` copies, per run folder of OUT_DIR, what ``report`` reads and nothing else into DEST/NAME:
``rank0.log.jsonl``, ``validation.jsonl``, the first and last validation's ``validation_problems``
files, and the text log's start lines (the GPU's name; the rest of the log is progress) with the
run's name for its folder and the config's file name for its path.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import fire

from oreal_fast.plot import find_metrics_file, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# oreal_fast.evaluator's 95 % normal quantile; not imported from there, which would load torch
Z = NormalDist().inv_cdf(0.975)


def run(out_dir: str, seeds: str | tuple | int = "0,1,2") -> None:
    """Trains ``configs/demo_long.py`` once per seed, one after another."""
    seeds = [int(s) for s in (seeds.split(",") if isinstance(seeds, str) else
                              seeds if isinstance(seeds, tuple) else [seeds])]
    os.makedirs(out_dir, exist_ok=True)
    for seed in seeds:
        cmd = [sys.executable, "-m", "oreal_fast.train", os.path.join(REPO, "configs", "demo_long.py"),
               "--seed", str(seed), "--work_dir", os.path.join(out_dir, f"seed{seed}")]
        print("+", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        with open(os.path.join(out_dir, "times.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"seed": seed, "wall_s": round(time.perf_counter() - t0, 1), "rc": rc}) + "\n")
        if rc != 0:
            raise SystemExit(f"seed {seed}: the trainer exited with {rc}")


# the GPU section's runs: name -> the trainer's arguments beside configs/evidence_gpu.py
GPU_RUNS = {
    "seed1": ["--seed", "1"],
    "seed2": ["--seed", "2"],
    "seed3": ["--seed", "3"],
    "lr0": ["--seed", "1", "--actor_lr", "0", "--actor_min_lr", "0"],
    "shuffled": ["--seed", "1", "--shuffle_rewards", "True"],
}
GRACE_S = 300  # after SIGTERM: a run finishes its step (and a validation) before it writes its state


def gpu_commands(out_dir: str, cap_gib: float, names: list[str], extra: str = "") -> dict[str, list[str]]:
    """The trainer command of each named run (``GPU_RUNS``), resumed where its folder has a resume state."""
    unknown = [n for n in names if n not in GPU_RUNS]
    if unknown:
        raise ValueError(f"no evidence run {unknown[0]!r}; the runs: {', '.join(GPU_RUNS)}")
    commands = {}
    for name in names:
        work = os.path.join(out_dir, name)
        resume = ["--resume", "auto"] if glob.glob(os.path.join(work, "*", "resume", "*.json")) else []
        commands[name] = [sys.executable, "-m", "oreal_fast.train", os.path.join(REPO, "configs", "evidence_gpu.py"),
                          *GPU_RUNS[name], "--gpu_memory_limit_gib", str(cap_gib), "--work_dir", work, *resume,
                          *shlex.split(extra)]
    return commands


def gpu(out_dir: str, seconds: float = 540, cap_gib: float = 14, names: str | tuple = ",".join(GPU_RUNS),
        extra: str = "") -> None:
    """The GPU section's runs side by side, for at most ``seconds`` this sitting (module docstring)."""
    names = list(names.split(",") if isinstance(names, str) else names)
    try:
        commands = gpu_commands(out_dir, cap_gib, names, extra)
    except ValueError as e:
        print(f"evidence gpu: {e}", file=sys.stderr)
        sys.exit(2)
    os.makedirs(out_dir, exist_ok=True)
    procs = {}
    for name, cmd in commands.items():
        print("+", shlex.join(cmd), flush=True)
        with open(os.path.join(out_dir, f"{name}.log"), "a", encoding="utf-8") as log:
            procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + seconds
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    stopped = {name for name, proc in procs.items() if proc.poll() is None}
    for name in stopped:
        procs[name].send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for name, proc in procs.items():
        line = f"{name}: {_steps_done(os.path.join(out_dir, name))} steps done, exit {proc.returncode}"
        if proc.returncode and name not in stopped:  # it failed on its own: the reason its log ends with
            line += f" ({_last_line(os.path.join(out_dir, f'{name}.log'))})"
        print(line)


def _last_line(path: str, limit: int = 400) -> str:
    """The last non-empty line of a log (progress bars' carriage returns split lines too), cut at ``limit``."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [part.strip() for part in f.read().replace("\r", "\n").splitlines() if part.strip()]
    return lines[-1][:limit] if lines else "its log is empty"


def _steps_done(work: str) -> int:
    """Rows in the metrics of the newest run folder under ``work`` (0 before its first step)."""
    try:
        with open(find_metrics_file(work), encoding="utf-8") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def plot(out_dir: str, png: str = os.path.join(REPO, "docs", "evidence.png")) -> None:
    """The figure and the Markdown table of the seeds found under ``out_dir``."""
    try:
        _plot(out_dir, png)
    except (FileNotFoundError, ValueError) as e:  # a missing or foreign run folder: one line, exit 2
        print(f"evidence plot: {e}", file=sys.stderr)
        sys.exit(2)


def _plot(out_dir: str, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = {}
    if os.path.isfile(os.path.join(out_dir, "times.jsonl")):
        with open(os.path.join(out_dir, "times.jsonl"), encoding="utf-8") as f:
            times = {r["seed"]: r for r in map(json.loads, f)}
    seed_dirs = sorted(glob.glob(os.path.join(out_dir, "seed*")), key=lambda p: int(p.rsplit("seed", 1)[1]))
    if not seed_dirs:
        raise FileNotFoundError(f"{out_dir}: no seed* folders")
    fig, (acc_ax, reward_ax, len_ax) = plt.subplots(1, 3, figsize=(17, 5))
    table, finals = [], []
    for seed_dir in seed_dirs:
        seed = int(seed_dir.rsplit("seed", 1)[1])
        metrics_file = find_metrics_file(seed_dir)
        train = read_metrics(metrics_file, panels=(("", ("avg_judger_reward", "avg_new_tokens")),))
        val = read_metrics(os.path.join(os.path.dirname(metrics_file), "validation.jsonl"),
                           panels=(("", ("val_greedy_pass1", "val_num_problems", "val_time")),))
        if not val:
            raise FileNotFoundError(f"{metrics_file}: the run did not validate (no validation.jsonl beside it)")
        steps = [r["step"] for r in train]
        acc_ax.plot([r["step"] for r in val], [100 * r["val_greedy_pass1"] for r in val], "o-", label=f"seed {seed}")
        reward_ax.plot(steps, [r["avg_judger_reward"] for r in train], alpha=0.7, label=f"seed {seed}")
        len_ax.plot(steps, [r["avg_new_tokens"] for r in train], alpha=0.7, label=f"seed {seed}")
        accs = " | ".join(f"{100 * r['val_greedy_pass1']:.1f} ({round(r['val_greedy_pass1'] * r['val_num_problems'])})"
                          for r in val)
        third = max(1, len(train) // 3)
        rewards = " / ".join(f"{_mean([r['avg_judger_reward'] for r in train[i:i + third]]):+.2f}"
                             for i in range(0, len(train), third))
        lengths = (f"{_mean([r['avg_new_tokens'] for r in train[:4]]):.0f} → "
                   f"{_mean([r['avg_new_tokens'] for r in train[-4:]]):.0f}")
        val_s = " + ".join(f"{r['val_time']:.0f}" for r in val)
        wall = f"{times[seed]['wall_s']:.0f} s" if seed in times else "?"
        table.append(f"| {seed} | {accs} | {rewards} | {lengths} | {wall} ({val_s} s) |")
        finals.append(100 * val[-1]["val_greedy_pass1"])
    acc_ax.set(title="held-out greedy accuracy", xlabel="steps trained", ylabel="% correct")
    reward_ax.set(title="train reward (mean of a step's samples, ±1)", xlabel="step", ylabel="avg_judger_reward")
    len_ax.set(title="train response length (tokens)", xlabel="step", ylabel="avg_new_tokens")
    for ax in (acc_ax, reward_ax, len_ax):
        ax.legend(fontsize=8)
    fig.suptitle("configs/demo_long.py: SmolLM2-135M-Instruct, OREAL on 2 CPU cores")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print("\n".join(table))
    spread = f", standard deviation {statistics.stdev(finals):.1f} points" if len(finals) > 1 else ""
    print(f"final accuracy: mean {_mean(finals):.1f} %{spread}, range {min(finals):.1f} .. {max(finals):.1f} %")
    print(f"wrote {png}")


# ------------------------------------------------------------------------------------------------
# report: seeds and controls of runs that validate with samples and log intervals

VAL_KEYS = ("val_num_problems", "val_greedy_pass1", "val_greedy_pass1_low", "val_greedy_pass1_high",
            "val_sampled_pass1", "val_sampled_pass1_low", "val_sampled_pass1_high", "val_time")
PROBLEM_KEYS = ("question", "greedy_correct", "num_correct", "num_samples")
SEED_NAME = re.compile(r"seed(\d+)")
# The trainer's start line in its text log: "run RUN_DIR: config CONFIG, ..." (CONFIG, the rest)
START_LINE = re.compile(r"run [^:]*: config (\S+),(.*)")
# The train curves' smoothing: a step's reward is the mean of 512 samples of 64 prompts, which jumps
# from step to step with the prompts drawn
SMOOTH_STEPS = 10


@dataclass(frozen=True)
class HeldOut:
    """One held-out metric of the table: its ``validation.jsonl`` key and one problem's score in
    [0, 1] from its ``validation_problems`` row (their mean over problems is the key's value)."""

    key: str
    score: Callable[[dict], float]


GREEDY = HeldOut("val_greedy_pass1", lambda p: float(p["greedy_correct"]))
MEAN_AT_N = HeldOut("val_sampled_pass1", lambda p: p["num_correct"] / p["num_samples"])


@dataclass
class Run:
    """One run: ``train`` rows (rank0.log.jsonl), ``validations`` rows (validation.jsonl),
    ``first`` and ``last`` the per-problem rows of its first and last validation, ``gpus`` the GPU
    names its text log gives (one per start of the trainer, deduplicated)."""

    name: str
    train: list[dict]
    validations: list[dict]
    first: list[dict]
    last: list[dict]
    gpus: list[str]

    @property
    def is_seed(self) -> bool:
        return SEED_NAME.fullmatch(self.name) is not None


def paired_gain(differences: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-problem differences (the same problems in both terms)
    +- Z standard errors over problems (sample standard deviation, N - 1 in its denominator). Not
    clipped: with the hundreds of problems it is meant for, it stays far inside the range a
    difference can take.

    Raises:
        ValueError: fewer than two problems (no spread to measure).
    """
    num = len(differences)
    if num < 2:
        raise ValueError(f"a paired interval needs at least 2 problems, got {num}")
    mean = sum(differences) / num
    half = Z * math.sqrt(sum((d - mean) ** 2 for d in differences) / (num - 1) / num)
    return mean, mean - half, mean + half


def _run_paths(out_dir: str | None, runs: str | tuple | None) -> list[tuple[str, str]]:
    """(name, folder) of each run: ``runs`` pairs in their order, else OUT_DIR's sub-folders, the
    seeds first by number, then the others by name."""
    if runs:
        pairs = [item.split("=", 1) for item in (runs.split(",") if isinstance(runs, str) else runs)]
        if any(len(p) != 2 or not all(p) for p in pairs):
            raise ValueError(f"--runs {runs!r}: give NAME=FOLDER pairs separated by commas")
        return [(name, path) for name, path in pairs]
    if out_dir is None:
        raise ValueError("give OUT_DIR or --runs NAME=FOLDER,...")
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"{out_dir}: no such folder")
    names = [n for n in os.listdir(out_dir) if os.path.isdir(os.path.join(out_dir, n))]
    if not names:
        raise FileNotFoundError(f"{out_dir}: no run folders in it")
    names.sort(key=lambda n: (0, int(SEED_NAME.fullmatch(n)[1]), "") if SEED_NAME.fullmatch(n) else (1, 0, n))
    return [(name, os.path.join(out_dir, name)) for name in names]


def _read_problems(run_dir: str, validation: dict) -> list[dict]:
    """The per-problem rows of one validation, checked against its ``val_num_problems``."""
    path = os.path.join(run_dir, "validation_problems", f"step-{validation['step']}.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: missing (validations of an oreal-fast that wrote no per-problem file?)")
    rows = read_metrics(path, panels=())
    bad = [k for k in PROBLEM_KEYS if any(not isinstance(r, dict) or k not in r for r in rows)]
    if bad or len(rows) != validation["val_num_problems"] or not rows[0]["num_samples"]:
        raise ValueError(f"{path}: not {validation['val_num_problems']} rows of {', '.join(PROBLEM_KEYS)} "
                         f"with num_samples > 0")
    return rows


def _load_run(name: str, path: str) -> Run:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such folder (run {name})")
    metrics_file = find_metrics_file(path)
    run_dir = os.path.dirname(metrics_file)
    train = read_metrics(metrics_file, panels=(("", ("avg_judger_reward", "avg_new_tokens", "total_time")),))
    validations = read_metrics(os.path.join(run_dir, "validation.jsonl"), panels=(("", ()),))
    if not train or not validations:
        raise ValueError(f"{run_dir}: no {'step' if not train else 'validation'} rows (run {name})")
    for row in validations:
        missing = [k for k in VAL_KEYS if k not in row]
        if missing:
            raise ValueError(f"{run_dir}/validation.jsonl: the validation after step {row['step']} has no "
                             f"{missing[0]!r} (greedy-only, or from an oreal-fast that logged no intervals)")
    return Run(name, train, validations, _read_problems(run_dir, validations[0]),
               _read_problems(run_dir, validations[-1]), _gpus(os.path.join(run_dir, "rank0.log")))


def _gpus(log_path: str) -> list[str]:
    """The GPU names of the trainer's start lines in a text log (``device cuda:0 (NAME)``), once
    each; none without a log."""
    if not os.path.isfile(log_path):
        return []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return list(dict.fromkeys(re.findall(r", device cuda\S* \(([^)]+)\)", f.read())))


def _differences(run: Run, metric: HeldOut) -> list[float]:
    """Per problem: the score at the run's last validation minus at its first."""
    if [p["question"] for p in run.first] != [p["question"] for p in run.last]:
        raise ValueError(f"run {run.name}: its first and last validations hold different problems")
    return [metric.score(b) - metric.score(a) for a, b in zip(run.first, run.last)]


def _metrics(runs: list[Run]) -> list[tuple[HeldOut, str]]:
    """The table's held-out metrics and their labels (n of mean@n from the first run)."""
    return [(GREEDY, "greedy pass@1"), (MEAN_AT_N, f"mean@{runs[0].first[0]['num_samples']}")]


def _pct(value: float, low: float, high: float, sign: str = "") -> str:
    return f"{100 * value:{sign}.1f} [{100 * low:{sign}.1f}, {100 * high:{sign}.1f}]"


def _gain_text(gain: tuple[float, float, float]) -> str:
    return _pct(*gain, sign="+")


def held_out_table(runs: list[Run]) -> list[str]:
    """Markdown: per run and metric, the value [95 % interval] in % at each validation step, and
    the gain from the first to the last validation in points [paired 95 % interval]."""
    steps = sorted({v["step"] for r in runs for v in r.validations})
    lines = ["| run | held-out | " + " | ".join(f"step {s}" for s in steps) + " | gain, first → last |",
             "|---|---|" + "---|" * (len(steps) + 1)]
    for run in runs:
        by_step = {v["step"]: v for v in run.validations}
        for metric, label in _metrics(runs):
            k = metric.key
            cells = [_pct(by_step[s][k], by_step[s][f"{k}_low"], by_step[s][f"{k}_high"]) if s in by_step
                     else "–" for s in steps]
            gain = paired_gain(_differences(run, metric))
            lines.append(f"| {run.name} | {label} | " + " | ".join(cells) + f" | {_gain_text(gain)} |")
    return lines


def _mean_of(rows: list[dict], key: str) -> float:
    return _mean([r[key] for r in rows])


def runs_table(runs: list[Run], gpu: str | None) -> list[str]:
    """Markdown: per run its steps, train reward and response length over the first and the last
    tenth of its steps, its time (steps' ``total_time`` + validations' ``val_time``) and its GPU (from
    its text log, else ``gpu``)."""
    lines = ["| run | steps | train reward, first → last tenth of steps | response length (tokens), same steps "
             "| time: steps + validations | GPU |", "|---|---|---|---|---|---|"]
    for run in runs:
        tenth = max(1, len(run.train) // 10)
        first, last = run.train[:tenth], run.train[-tenth:]
        reward = f"{_mean_of(first, 'avg_judger_reward'):+.2f} → {_mean_of(last, 'avg_judger_reward'):+.2f}"
        length = f"{_mean_of(first, 'avg_new_tokens'):.0f} → {_mean_of(last, 'avg_new_tokens'):.0f}"
        seconds = (f"{sum(r['total_time'] for r in run.train):.0f} + "
                   f"{sum(v['val_time'] for v in run.validations):.0f} s")
        lines.append(f"| {run.name} | {run.train[-1]['step']} | {reward} | {length} | {seconds} | "
                     f"{', '.join(run.gpus) or gpu or '?'} |")
    return lines


def gain_table(runs: list[Run]) -> list[str]:
    """Markdown: per metric, the seeds' mean gain (per problem, the mean of the seeds' differences;
    paired interval over problems) with the seeds' standard deviation, each control's gain, and the
    seeds' mean gain minus each control's, paired over the same problems."""
    questions = [p["question"] for p in runs[0].first]
    for run in runs[1:]:
        if [p["question"] for p in run.first] != questions:
            raise ValueError(f"runs {runs[0].name} and {run.name} validated on different problems")
    seeds, controls = [r for r in runs if r.is_seed], [r for r in runs if not r.is_seed]
    header = ([f"seeds' mean ({', '.join(r.name for r in seeds)}; standard deviation)"] if seeds else [])
    for control in controls:
        header += [control.name] + ([f"seeds − {control.name}"] if seeds else [])
    lines = [f"Gain from the first to the last validation, points [paired 95 % interval over {len(questions)} "
             "problems]:", "", "| held-out | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    for metric, label in _metrics(runs):
        diffs = {r.name: _differences(r, metric) for r in runs}
        cells = []
        if seeds:
            seed_mean = [_mean(ds) for ds in zip(*(diffs[r.name] for r in seeds))]  # per problem
            each = [100 * _mean(diffs[r.name]) for r in seeds]
            spread = f"{statistics.stdev(each):.1f}" if len(seeds) > 1 else "–"
            cells.append(f"{_gain_text(paired_gain(seed_mean))} ({spread})")
        for control in controls:
            cells.append(_gain_text(paired_gain(diffs[control.name])))
            if seeds:
                cells.append(_gain_text(paired_gain([s - c for s, c in zip(seed_mean, diffs[control.name])])))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def parse_groups(groups: str | tuple) -> list[tuple[str, str]]:
    """``NAME=PREFIX`` pairs (comma-separated) -> [(name, question prefix)], in order; an empty
    prefix (last) takes every question no earlier group took."""
    pairs = [item.split("=", 1) for item in (groups.split(",") if isinstance(groups, str) else groups)]
    if any(len(p) != 2 or not p[0] for p in pairs):
        raise ValueError(f"--groups {groups!r}: give NAME=QUESTION_PREFIX pairs separated by commas")
    return [(name, prefix) for name, prefix in pairs]


def group_table(runs: list[Run], groups: list[tuple[str, str]]) -> list[str]:
    """Markdown: per run and group of problems (the first group whose prefix opens the question;
    ``other`` for none), the held-out greedy problems right at the first and the last validation
    (the runs validate on the same problems: `gain_table` checks it)."""
    def group_of(question: str) -> str:
        return next((name for name, prefix in groups if question.startswith(prefix)), "other")

    def right(rows: list[dict]) -> Counter:
        return Counter(group_of(p["question"]) for p in rows if p["greedy_correct"])

    sizes = Counter(group_of(p["question"]) for p in runs[0].first)
    names = [n for n in [name for name, _ in groups] + ["other"] if sizes[n]]
    lines = ["Held-out greedy problems right, first → last validation (of the group's problems):", "",
             "| run | " + " | ".join(f"{n} ({sizes[n]})" for n in names) + " |", "|---|" + "---|" * len(names)]
    for run in runs:
        first, last = right(run.first), right(run.last)
        lines.append(f"| {run.name} | " + " | ".join(f"{first[n]} → {last[n]}" for n in names) + " |")
    return lines


def _trailing_mean(values: list[float], window: int) -> list[float]:
    """Each value replaced by the mean of it and up to ``window - 1`` values before it."""
    return [_mean(values[max(0, i + 1 - window):i + 1]) for i in range(len(values))]


def _draw(runs: list[Run], png: str) -> None:
    """Held-out greedy pass@1 and mean@n (95 % bands), train reward and response length against
    the step; seeds solid, controls dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((greedy_ax, mean_ax), (reward_ax, len_ax)) = plt.subplots(2, 2, figsize=(13, 9))
    for i, run in enumerate(runs):
        style = dict(color=f"C{i}", linestyle="-" if run.is_seed else "--", label=run.name)
        val_steps = [v["step"] for v in run.validations]
        for ax, key in ((greedy_ax, GREEDY.key), (mean_ax, MEAN_AT_N.key)):
            ax.plot(val_steps, [100 * v[key] for v in run.validations], marker="o", **style)
            ax.fill_between(val_steps, [100 * v[f"{key}_low"] for v in run.validations],
                            [100 * v[f"{key}_high"] for v in run.validations], color=style["color"], alpha=0.12)
        steps = [r["step"] for r in run.train]
        for ax, key in ((reward_ax, "avg_judger_reward"), (len_ax, "avg_new_tokens")):
            values = [r[key] for r in run.train]
            ax.plot(steps, values, color=style["color"], linewidth=0.6, alpha=0.3)
            ax.plot(steps, _trailing_mean(values, SMOOTH_STEPS), linewidth=1.5, **style)
    for ax, (_, label) in zip((greedy_ax, mean_ax), _metrics(runs)):
        ax.set(title=f"held-out {label} (95 % interval)", xlabel="steps trained", ylabel="% correct")
    smoothed = f"{SMOOTH_STEPS}-step mean; faint: each step"
    reward_ax.set(title=f"train reward, ±1 ({smoothed})", xlabel="step", ylabel="avg_judger_reward")
    len_ax.set(title=f"train response length, tokens ({smoothed})", xlabel="step", ylabel="avg_new_tokens")
    for ax in (greedy_ax, mean_ax, reward_ax, len_ax):
        ax.legend(fontsize=8)
    fig.suptitle("seeds (solid) and controls (dashed)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def keep(out_dir: str, dest: str) -> None:
    """Copies what `report` reads of each run in ``out_dir`` to ``dest/NAME`` (module docstring)."""
    try:
        for name, path in _run_paths(out_dir, None):
            run_dir = os.path.dirname(find_metrics_file(path))
            validations = read_metrics(os.path.join(run_dir, "validation.jsonl"), panels=(("", ()),))
            if not validations:
                raise ValueError(f"{run_dir}: no validation rows (run {name})")
            target = os.path.join(dest, name)
            os.makedirs(os.path.join(target, "validation_problems"), exist_ok=True)
            for file in ("rank0.log.jsonl", "validation.jsonl"):
                shutil.copyfile(os.path.join(run_dir, file), os.path.join(target, file))
            for step in dict.fromkeys((validations[0]["step"], validations[-1]["step"])):
                file = os.path.join("validation_problems", f"step-{step}.jsonl")
                shutil.copyfile(os.path.join(run_dir, file), os.path.join(target, file))
            log = os.path.join(run_dir, "rank0.log")
            if os.path.isfile(log):
                with open(log, encoding="utf-8", errors="replace") as f:
                    # the machine's folders left out: "run NAME: config FILE, N steps, device ..."
                    starts = [f"run {name}: config {os.path.basename(m[1])},{m[2]}\n"
                              for m in map(START_LINE.match, f) if m]
                with open(os.path.join(target, "rank0.log"), "w", encoding="utf-8") as f:
                    f.writelines(starts)
            print(f"{name}: {run_dir} -> {target}")
    except (FileNotFoundError, ValueError) as e:  # a missing or foreign run folder: one line, exit 2
        print(f"evidence keep: {e}", file=sys.stderr)
        sys.exit(2)


def report(out_dir: str | None = None, runs: str | tuple | None = None, gpu: str | None = None,
           png: str = os.path.join(REPO, "docs", "evidence_gpu.png"), groups: str | tuple | None = None) -> None:
    """Prints the held-out table, the runs' table and the gains of seeds and controls, and draws
    the figure to ``png``.

    Args:
        out_dir: a folder of run folders (``seed<N>`` = a seed, any other name = a control).
        runs: instead, ``NAME=FOLDER`` pairs separated by commas, in table order.
        gpu: the GPU of runs whose text log names none.
        png: where the figure goes.
        groups: ``NAME=QUESTION_PREFIX`` pairs: also a table of greedy problems right per group.
    """
    try:
        loaded = [_load_run(name, path) for name, path in _run_paths(out_dir, runs)]
        lines = held_out_table(loaded) + [""] + runs_table(loaded, gpu) + [""] + gain_table(loaded)
        if groups:
            lines += [""] + group_table(loaded, parse_groups(groups))
        _draw(loaded, png)
    except (FileNotFoundError, ValueError) as e:  # a missing or foreign run folder: one line, exit 2
        print(f"evidence report: {e}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(lines))
    print(f"wrote {png}")


if __name__ == "__main__":
    fire.Fire({"run": run, "gpu": gpu, "plot": plot, "report": report, "keep": keep})
