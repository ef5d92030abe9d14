"""``python -m oreal_fast.plot RUN_DIR [--out FILE]``: one PNG of a run's curves over steps.

Reads ``rank0.log.jsonl`` of a run folder (or the newest run under a ``work_dir``) and draws
reward, the three actor loss terms, the token-RM loss, KL and response length; when the run
validated, also the held-out pass rates of ``validation.jsonl`` (step 0 = the initial actor).
Writes ``RUN_DIR/curves.png`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys

import fire

PANELS = (
    ("judger reward (mean, +-1)", ("avg_judger_reward",)),
    ("actor loss terms", ("positive_loss", "negative_loss", "kl_penalty_loss", "rl_loss")),
    ("token-level RM loss (BCE)", ("token_level_rm_loss",)),
    ("KL to reference (k1, per token)", ("avg_ref_kl",)),
    ("response length (tokens)", ("avg_new_tokens",)),
    ("learning rates", ("actor_lr", "token_level_rm_lr")),
)
VAL_PANEL = ("held-out pass rate", ("val_greedy_pass1", "val_sampled_pass1", "val_pass_at_k"))


def find_metrics_file(path: str) -> str:
    """The jsonl of a run folder, or of the newest run folder under a work_dir."""
    direct = os.path.join(path, "rank0.log.jsonl")
    if os.path.isfile(direct):
        return direct
    runs = sorted(glob.glob(os.path.join(path, "*", "rank0.log.jsonl")))
    if not runs:
        raise FileNotFoundError(f"{path}: no rank0.log.jsonl here or in a run folder below it")
    return runs[-1]


def read_metrics(path: str, panels=PANELS) -> list[dict]:
    """The rows of a jsonl file, none when it does not exist (a run without validation); a line that
    is not a JSON object with a step and every key of ``panels`` is a ValueError naming it."""
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            missing = [k for _, keys in panels for k in ("step", *keys) if not isinstance(row, dict) or k not in row]
            if missing:
                raise ValueError(f"{path}:{lineno}: no {missing[0]!r} (not a metrics row of oreal-fast)")
            rows.append(row)
    return rows


def plot_run(path: str, out: str | None = None) -> str:
    """Draws the panels for the run at ``path``; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metrics_file = find_metrics_file(path)
    rows = read_metrics(metrics_file)
    if not rows:
        raise ValueError(f"{metrics_file} holds no step yet")
    panels = [(title, keys, rows) for title, keys in PANELS]
    # sampled pass rates exist only when sampled: each validation row needs just its step
    val_rows = read_metrics(os.path.join(os.path.dirname(metrics_file), "validation.jsonl"), panels=[("", ())])
    if val_rows:
        panels.append((*VAL_PANEL, val_rows))
    num_cols = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(2, num_cols, figsize=(5 * num_cols, 8), constrained_layout=True)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, keys, panel_rows) in zip(axes.flat, panels):
        keys = [k for k in keys if k in panel_rows[0]]  # sampled pass rates exist only when sampled
        for key in keys:
            ax.plot([r["step"] for r in panel_rows], [r[key] for r in panel_rows], marker="o", markersize=3,
                    label=key)
        if title == VAL_PANEL[0]:  # shares drawn to scale: one problem more is not a trend
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(os.path.dirname(os.path.abspath(metrics_file)))
    out = out or os.path.join(os.path.dirname(metrics_file), "curves.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(run_dir: str, out: str | None = None) -> None:
    try:
        written = plot_run(run_dir, out)
    except (FileNotFoundError, ValueError) as e:
        print(f"plot: {e}", file=sys.stderr)
        sys.exit(2)
    print(written)


if __name__ == "__main__":
    fire.Fire(main)
