"""Where two runs of the same steps differ: every reproducible metric, step by step, as JSON.

    python benchmarks/compare_runs.py A/rank0.log.jsonl B/rank0.log.jsonl --out compare.json

Timings, throughputs and peak memory are left out (``oreal_fast.metrics.reproducible_metrics``).
Writes ``{"a", "b", "steps_a", "steps_b", "differences": {step: {key: [value in a, value in b]}}}``,
a key missing from one side as ``null``, and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys

from oreal_fast.metrics import reproducible_metrics
from oreal_fast.plot import read_metrics


def compare(path_a: str, path_b: str) -> dict:
    def steps(path: str) -> dict[int, dict]:
        rows = read_metrics(path, panels=())
        if not rows:
            raise FileNotFoundError(f"{path}: no such file, or no rows in it")
        return {row["step"]: reproducible_metrics(row) for row in rows}

    a, b = steps(path_a), steps(path_b)
    differences = {}
    for step in sorted(a.keys() & b.keys()):
        keys = list(dict.fromkeys([*a[step], *b[step]]))
        changed = {k: [a[step].get(k), b[step].get(k)] for k in keys if a[step].get(k) != b[step].get(k)}
        if changed:
            differences[step] = changed
    return {"a": path_a, "b": path_b, "steps_a": sorted(a), "steps_b": sorted(b), "differences": differences}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    try:
        report = compare(args.a, args.b)
    except (FileNotFoundError, ValueError) as e:  # a missing file or a line that is not a metrics row
        print(f"compare_runs: {e}", file=sys.stderr)
        sys.exit(2)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
