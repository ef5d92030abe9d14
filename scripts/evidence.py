"""Three seeds of ``configs/demo_long.py`` and the figure and table of docs/evidence.md.

    python scripts/evidence.py run  OUT_DIR [--seeds 0,1,2]   # trains each seed, one after another
    python scripts/evidence.py plot OUT_DIR [--png docs/evidence.png]

``run`` starts ``python -m oreal_fast.train configs/demo_long.py --seed S --work_dir OUT_DIR/seedS``
for each seed and appends ``{"seed", "wall_s", "rc"}`` to ``OUT_DIR/times.jsonl`` as each finishes.
``plot`` reads each seed's run folder (``validation.jsonl`` and ``rank0.log.jsonl``), draws
held-out greedy accuracy, train reward and response length against the step, and prints the
Markdown table of docs/evidence.md (accuracy at each validation, train reward over thirds of the
run, response length of the first and last 4 steps, wall time).
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import subprocess
import sys
import time

import fire

from oreal_fast.plot import find_metrics_file, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


if __name__ == "__main__":
    fire.Fire({"run": run, "plot": plot})
