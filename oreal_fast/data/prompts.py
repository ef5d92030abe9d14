"""Prompt records: loading from jsonl files and Hugging Face datasets, and difficulty balancing.

Reference sections 3.1 and 3.2. A record is one math question with its gold answer and the
dataset's pass rate (fraction of 16 samples of the SFT model that were correct). What this module
does not do: tokenise (see ``chat.py``) or order the records (see ``sampler.py``).

Invariant: every record that leaves :func:`load_prompt_records` has a non-empty str question, a
non-empty str gold answer (never None, which the judge would read as the answer "None") and a
finite pass rate in [0, 1]; anything else stops with a :class:`DataError` that
names the source, the line (jsonl) or row (dataset), and the field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from oreal_fast.package_refs import is_package_ref, resolve_package_ref

DATA_SOURCE = "math"  # the official trainer hard-codes it; it routes every sample to math_judger


class DataError(Exception):
    """Bad prompt data; the message names the source, line or row, and field."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of the RL dataset (reference 3.1)."""

    question: str
    gold_answer: str
    pass_rate: float

    @property
    def message_data(self) -> list[dict[str, str]]:
        """The one-message conversation the chat template renders (no system message)."""
        return [{"role": "user", "content": self.question}]

    @property
    def metadata(self) -> dict[str, str]:
        """What the judge needs besides the response."""
        return {"data_source": DATA_SOURCE, "gold_answer": self.gold_answer}


def resolve_path(ref: str) -> str:
    """Turns ``package://<module>/<file>`` into the file's path inside that installed package.

    Other strings are returned unchanged. Raises ValueError if the package is not installed.
    """
    return resolve_package_ref(ref) if is_package_ref(ref) else ref


def load_prompt_records(sources: str | Sequence[str], max_prompts: int | None = None) -> list[PromptRecord]:
    """Loads and concatenates prompt records, in source order.

    Args:
        sources: one source or a list; a source ending in ``.jsonl`` is a file path (or
            ``package://`` ref), anything else a Hugging Face dataset id (split ``train``).
        max_prompts: keep only the first N records of the concatenation; None = all.

    Returns:
        The records, before balancing.

    Raises:
        DataError: a missing file, a malformed line, or a missing or wrong-typed field.
    """
    sources = [sources] if isinstance(sources, str) else list(sources)
    records: list[PromptRecord] = []
    for source in sources:
        records.extend(_load_jsonl(source) if source.endswith(".jsonl") else _load_hf(source))
        if max_prompts is not None and len(records) >= max_prompts:
            break
    return records[:max_prompts] if max_prompts is not None else records


def _load_jsonl(source: str) -> list[PromptRecord]:
    try:
        path = resolve_path(source)
    except ValueError as e:
        raise DataError(str(e)) from None
    if not os.path.isfile(path):
        raise DataError(f"{path}: prompt file does not exist")
    records = []
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().splitlines()
    except OSError as e:
        raise DataError(f"{path}: prompt file cannot be read ({os.strerror(e.errno) if e.errno else e})") from None
    for lineno, raw in enumerate(raw_lines, start=1):
        where = f"{path}:{lineno}"
        try:  # line by line, so that the error names the line that holds the bad byte
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: not valid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        records.append(_to_record(row, where))
    return records


def _load_hf(source: str) -> list[PromptRecord]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source!r} is read as a Hugging Face dataset id, but the 'datasets' package is "
                        "not installed (pip install 'oreal-fast[datasets]'); local files must end in .jsonl") from None
    try:
        rows = datasets.load_dataset(source, split="train")
    except Exception as e:  # hub, cache and format errors all mean: this source cannot be read
        raise DataError(f"{source!r}: cannot load the dataset's train split ({type(e).__name__}: {e})") from None
    return [_to_record(row, f"{source}:row {i}") for i, row in enumerate(rows)]


def _to_record(row: Any, where: str) -> PromptRecord:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name, kinds in (("question", str), ("gold_answer", str), ("pass_rate", (int, float))):
        if name not in row:
            raise DataError(f"{where}: field {name!r} is missing")
        value = row[name]
        if not isinstance(value, kinds) or isinstance(value, bool):
            expected = "a number" if name == "pass_rate" else "a string"
            raise DataError(f"{where}: field {name!r} must be {expected}, got {type(value).__name__} {value!r}")
    for name in ("question", "gold_answer"):  # a blank gold answer would make every sample -1
        if not row[name].strip():
            raise DataError(f"{where}: field {name!r} is empty")
    pass_rate = float(row["pass_rate"])
    if not (math.isfinite(pass_rate) and 0.0 <= pass_rate <= 1.0):
        raise DataError(f"{where}: field 'pass_rate' must be in [0, 1], got {row['pass_rate']!r}")
    return PromptRecord(row["question"], row["gold_answer"], pass_rate)


def balance_by_difficulty(
    records: Iterable[PromptRecord],
    balance_cfg: Sequence[tuple[tuple[float, float], int]] | None,
) -> list[PromptRecord]:
    """Re-weights records by pass rate exactly as the official trainer (reference 3.2).

    Each record goes to the first bucket ``((low, high), copies)`` with ``low <= pass_rate < high``
    and is repeated ``copies`` times, the copies adjacent; a record in no bucket is dropped.
    An empty or None config returns the records unchanged.
    """
    records = list(records)
    if not balance_cfg:
        return records
    balanced = []
    for record in records:
        for (low, high), copies in balance_cfg:
            if low <= record.pass_rate < high:
                balanced.extend([record] * copies)
                break
    return balanced
