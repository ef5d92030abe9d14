"""Print the decode-step table (`test_bench_decode.py`) and the rollout cases (`test_bench_rollout.py`)
of pytest-benchmark JSON files, one block per file.

  python benchmarks/decode_report.py OUT/decode.json [OUT/decode_baseline.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DECODE = ("step_ms", "floor_ms", "gpu_ms", "wall_over_gpu", "kernels_per_step")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def report(path: Path) -> list[str]:
    text = path.read_text() if path.exists() else ""
    if not text.strip():  # a run that timed out or saved nothing
        return [f"== {path.name}: no results"]
    benchmarks = json.loads(text)["benchmarks"]
    lines = [f"== {path.name}",
             "case | step ms | floor ms | step/floor | gpu ms | wall/gpu | kernels/step | rounds | wasted"]
    for b in benchmarks:
        x = b["extra_info"]
        if "step_ms" in x:
            ratio = x["step_ms"] / x["floor_ms"]
            cells = [x[k] for k in DECODE[:2]] + [ratio] + [x[k] for k in DECODE[2:]]
            cells += [x.get("engine_decode_rounds"), x.get("engine_wasted_row_steps")]
            lines.append(" | ".join([b["param"]] + [_fmt(c) for c in cells]))
    for b in benchmarks:
        x = b["extra_info"]
        if "tokens_per_s" in x:
            lines.append(f"rollout {b['param']}: {x['tokens_per_s']:.0f} new tok/s, {x['wall_s']:.2f} s, "
                         f"mean live batch {_fmt(x.get('engine_mean_live_batch'))}, "
                         f"decode steps {_fmt(x.get('engine_decode_steps'))}")
    return lines


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("\n".join(report(Path(arg))))
