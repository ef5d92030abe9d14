"""The pytest-benchmark JSON files that the benchmarks/gpu_*.sh scripts write under $OUT, read back for
their summaries."""

from __future__ import annotations

import json


def cases(out: str, name: str) -> list[dict]:
    """The benchmarks of $OUT/<name>.json; none when the step saved nothing (it timed out or failed)."""
    try:
        with open(f"{out}/{name}.json") as f:
            return json.load(f)["benchmarks"]
    except (OSError, ValueError, KeyError):
        return []


def show(out: str, name: str, keys: tuple[str, ...] | None = None) -> None:
    """One line per benchmark: its name and its extra_info (only `keys` when given), floats rounded."""
    for b in cases(out, name):
        info = b["extra_info"]
        picked = {k: info.get(k) for k in keys} if keys else {k: v for k, v in info.items() if k != "oreal_fast_path"}
        print(b["name"], {k: round(v, 4) if isinstance(v, float) else v for k, v in picked.items()})
