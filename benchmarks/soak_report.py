"""A long run's health, step by step: a table, a plot and the growth of every counter.

    python benchmarks/soak_report.py RUN_DIR_OR_JSONL --out DIR [--every N]

Reads a run's ``rank0.log.jsonl`` and writes under DIR: ``soak_table.md`` (a markdown row every N
steps and at the last step: step time, peak GPU memory, host RSS, open files, judge workers, and the
GPU memory still allocated after the step and the rollout's KV blocks in use when the run logged
them), ``soak.png`` (each of those over every step) and ``soak_summary.json`` (per counter the mean
over the second fifth of the steps, the first fifth being warm-up, and over the last fifth, and
their difference). A counter that keeps growing between the two windows is a leak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from oreal_fast.plot import find_metrics_file, read_metrics

# (metrics key, column title): the step's wall time and its peak memory (the official keys), then the
# counters of oreal_fast.health
COLUMNS = (
    ("total_time", "step s"),
    ("max_memory", "peak GiB"),  # the step's peak GPU memory (on CPU: the process's peak RSS)
    ("gpu_allocated_gib", "GPU allocated after GiB"),
    ("host_rss_gib", "host RSS GiB"),
    ("open_fds", "open fds"),
    ("judge_workers", "judge workers"),
)
KV_SUFFIX = "kv_blocks_in_use"  # the rollout's count, logged as rollout_<name> where the engine reports it


def columns(rows: list[dict]) -> list[tuple[str, str]]:
    """The COLUMNS the run logged, plus the rollout's KV blocks in use when present."""
    present = [(k, title) for k, title in COLUMNS if k in rows[0]]
    kv = [k for k in rows[0] if k.endswith(KV_SUFFIX)]
    return present + [(kv[0], "KV blocks in use")] if kv else present


def table(rows: list[dict], every: int) -> str:
    """Markdown rows for steps 1, 1 + every, ... and the last step."""
    cols = columns(rows)
    shown = [r for i, r in enumerate(rows) if i % every == 0 or i == len(rows) - 1]
    lines = ["| step | " + " | ".join(title for _, title in cols) + " |",
             "|---:|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join([str(r["step"]), *(_cell(r[k]) for k, _ in cols)]) + " |" for r in shown]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary(rows: list[dict]) -> dict:
    """Per counter: mean of the second fifth of the steps, of the last fifth, and late minus early."""
    n = len(rows)
    early, late = rows[n // 5 : max(2 * n // 5, n // 5 + 1)], rows[n - max(n // 5, 1) :]
    out = {"steps": n, "early_steps": [early[0]["step"], early[-1]["step"]],
           "late_steps": [late[0]["step"], late[-1]["step"]], "counters": {}}
    for key, _ in columns(rows):
        a, b = (statistics.fmean(r[key] for r in part if r[key] is not None) for part in (early, late))
        out["counters"][key] = {"early_mean": a, "late_mean": b, "growth": b - a}
    return out


def plot(rows: list[dict], path: str, title: str) -> None:
    """One panel per column over every step, each axis from 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = columns(rows)
    fig, axes = plt.subplots(len(cols), 1, figsize=(8, 1.9 * len(cols)), sharex=True, constrained_layout=True)
    steps = [r["step"] for r in rows]
    for ax, (key, name) in zip(axes, cols):
        values = [r[key] for r in rows]
        ax.plot(steps, values, linewidth=1)
        # from 0, to scale: an axis zoomed onto the data draws allocator noise as a slope
        ax.set_ylim(0, 1.15 * max(v for v in values if v is not None) or 1)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(path: str, out_dir: str, every: int) -> dict:
    """Writes the three files for the run at ``path``; returns the summary."""
    metrics_file = find_metrics_file(path) if os.path.isdir(path) else path
    rows = read_metrics(metrics_file, panels=())
    if not rows:
        raise FileNotFoundError(f"{metrics_file}: no such file, or no rows in it")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "soak_table.md"), "w", encoding="utf-8") as f:
        f.write(table(rows, every))
    plot(rows, os.path.join(out_dir, "soak.png"), metrics_file)
    result = summary(rows)
    with open(os.path.join(out_dir, "soak_summary.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder, a work_dir (its newest run) or a rank0.log.jsonl")
    parser.add_argument("--out", required=True)
    parser.add_argument("--every", type=int, default=10, help="a table row every N steps")
    args = parser.parse_args()
    try:
        result = report(args.run, args.out, args.every)
    except (FileNotFoundError, ValueError) as e:
        print(f"soak_report: {e}", file=sys.stderr)
        sys.exit(2)
    with open(os.path.join(args.out, "soak_table.md"), encoding="utf-8") as f:
        print(f.read())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
