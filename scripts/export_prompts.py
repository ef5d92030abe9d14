"""A config's training and held-out problems written out as JSONL, for machines that cannot make them.

    python scripts/export_prompts.py CONFIG OUT_DIR [--KEY VALUE ...]

Sources such as reasoning-gym tasks or Hugging Face datasets need their package (and, for a dataset
id, the network) where the run starts. A GPU node without them can train on the same problems from
files: this script loads ``datasets`` and ``val_datasets`` of CONFIG (after the overrides) exactly as
the trainer would, writes ``OUT_DIR/train.jsonl`` and ``OUT_DIR/val.jsonl`` (one
``{"question", "gold_answer"}`` object per line, in load order, before difficulty balancing), and
prints the overrides that train on them. The trainer reads those files back into the same records
(``tests/test_export_prompts.py``).

What it does not do: pass rates (exported sets cannot be balanced by difficulty) or judger routing
(every record must have one ``data_source``, given to the trainer with the files).
Invariant: the files hold the records the config's sources give, field for field.
"""

from __future__ import annotations

import json
import os
import sys

import fire

from oreal_fast.config import ConfigError, load_config
from oreal_fast.data.prompts import DataError, PromptRecord, load_prompt_records


def write_jsonl(records: list[PromptRecord], path: str) -> None:
    """One ``{"question", "gold_answer"}`` object per line, UTF-8."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({"question": r.question, "gold_answer": r.gold_answer}, ensure_ascii=False) + "\n")


def _one_route(records: list[PromptRecord], name: str) -> str:
    routes = sorted({r.data_source for r in records})
    if len(routes) != 1:
        raise DataError(f"{name}: records route to several judgers ({', '.join(routes)}); export each source apart")
    return routes[0]


def export(config: str, out_dir: str, **overrides: object) -> None:
    """Writes OUT_DIR/train.jsonl (and val.jsonl when the config has held-out problems)."""
    try:
        cfg = load_config(config, overrides)
        sets = {"train": load_prompt_records(cfg.datasets, max_prompts=cfg.max_prompts)}
        if cfg.val_datasets is not None:
            sets["val"] = load_prompt_records(cfg.val_datasets, max_prompts=cfg.val_max_problems)
        routes = {name: _one_route(records, name) for name, records in sets.items()}
    except (ConfigError, DataError) as e:
        print(f"export_prompts: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    os.makedirs(out_dir, exist_ok=True)
    flags = []
    for name, records in sets.items():
        path = os.path.abspath(os.path.join(out_dir, f"{name}.jsonl"))
        write_jsonl(records, path)
        print(f"{name}: {len(records)} problems -> {path}")
        source = {"path": path, "data_source": routes[name]}
        flags.append(f"--{'datasets' if name == 'train' else 'val_datasets'} '{json.dumps(source)}'")
    print("train on them with:", " ".join(flags))


if __name__ == "__main__":
    fire.Fire(export)
