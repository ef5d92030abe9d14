"""Prompt records: loading them from the sources of ``datasets`` / ``val_datasets``, and difficulty balancing.

Reference sections 3.1 and 3.2. A record is one math question with its gold answer, the dataset's pass rate
(fraction of 16 samples of the SFT model that were correct; None where the data has none) and the
data_source that routes it to a judger. The source forms are those of ``sources.py``: ``.jsonl`` files are
read here line by line (no extra package); ``.json``, ``.parquet``, dataset folders and Hugging Face ids
through ``datasets``; reasoning-gym tasks through ``procedural.py``. What this module does not do: tokenise
(see ``chat.py``) or order the records (see ``sampler.py``).

Invariant: every record that leaves :func:`load_prompt_records` has a non-empty str question, a non-empty
str gold answer (never None, which the judge would read as the answer "None") and a pass rate that is None
or a finite number in [0, 1]; anything else stops with a :class:`DataError` that names the source, the line
(jsonl) or row (dataset), and the field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from oreal_fast.data import procedural
from oreal_fast.data.sources import (
    DEFAULT_DATA_SOURCE,
    FileSource,
    GymSource,
    Source,
    describe_extractor,
    extract_answer,
    parse_sources,
    resolve_path,
)

class DataError(Exception):
    """Bad prompt data; the message names the source, line or row, and field."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of the RL dataset (reference 3.1)."""

    question: str
    gold_answer: str
    pass_rate: float | None = None  # None: the source gives none (difficulty balancing then refuses it)
    data_source: str = DEFAULT_DATA_SOURCE

    @property
    def message_data(self) -> list[dict[str, str]]:
        """The one-message conversation the chat template renders (no system message)."""
        return [{"role": "user", "content": self.question}]

    @property
    def metadata(self) -> dict[str, str]:
        """What the judge needs besides the response."""
        return {"data_source": self.data_source, "gold_answer": self.gold_answer}


def load_prompt_records(sources: Any, max_prompts: int | None = None) -> list[PromptRecord]:
    """Loads and concatenates prompt records, in source order.

    Args:
        sources: one source or a list, in any form of ``sources.py`` (a path or dataset id, a dict with
            ``path`` and its split / field names / extractor, a dict with ``reasoning_gym``).
        max_prompts: keep only the first N records of the concatenation; None = all.

    Returns:
        The records, before balancing.

    Raises:
        DataError: a bad source, a missing file, split or field, a malformed line or row, an answer
            field without an answer in the source's format.
    """
    try:
        parsed = parse_sources(sources)
    except ValueError as e:
        raise DataError(str(e)) from None
    records: list[PromptRecord] = []
    for source in parsed:
        records.extend(_load_source(source))
        if max_prompts is not None and len(records) >= max_prompts:
            break
    return records[:max_prompts] if max_prompts is not None else records


def _load_source(source: Source) -> list[PromptRecord]:
    excluded = {r.question for other in source.exclude for r in _load_source(other)}
    if isinstance(source, GymSource):
        return _load_gym(source, excluded)
    rows = _jsonl_rows(source) if source.path.endswith(".jsonl") else _dataset_rows(source)
    records = (_to_record(row, where, source) for where, row in rows)
    return [r for r in records if r.question not in excluded]


def _local_path(source: FileSource) -> str:
    try:
        path = resolve_path(source.path)
    except ValueError as e:
        raise DataError(str(e)) from None
    if not os.path.isfile(path):
        raise DataError(f"{path}: prompt file does not exist")
    return path


def _jsonl_rows(source: FileSource) -> Iterator[tuple[str, Any]]:
    path = _local_path(source)
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
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None


def _dataset_rows(source: FileSource) -> Iterator[tuple[str, Any]]:
    """Rows read through ``datasets``, after checking that the question and answer fields exist."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source.label!r} is read through the 'datasets' package, which is not installed "
                        "(pip install 'oreal-fast[datasets]'); .jsonl files need no extra package") from None
    label = _local_path(source) if source.is_file else source.label
    table = _load_table(datasets, source, label)
    missing = [name for name in (source.question, source.answer) if name not in table.column_names]
    if missing:
        raise DataError(f"{label}: no field {missing[0]!r}; its fields are {', '.join(table.column_names)} "
                        "(name the question and answer fields with 'question' and 'answer' in a dict source)")
    return ((f"{label}:row {i}", row) for i, row in enumerate(table))


def _load_table(datasets: Any, source: FileSource, label: str) -> Any:
    split = source.split or "train"  # a single file is read as the one split "train"
    try:
        if source.is_file:
            builder = "parquet" if label.endswith(".parquet") else "json"
            return datasets.load_dataset(builder, data_files=label, split="train")
        return datasets.load_dataset(source.path, source.subset, split=split)
    except Exception as e:  # hub, cache and format errors all mean: this source cannot be read
        if not source.is_file:
            splits = _split_names(datasets, source)
            if splits and split not in splits:
                raise DataError(f"{label}: no split {split!r}; it has {', '.join(splits)} "
                                "(choose one with 'split' in a dict source)") from None
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DataError(f"{label}: cannot be loaded ({type(e).__name__}: {first_line})") from None


def _split_names(datasets: Any, source: FileSource) -> list[str] | None:
    try:
        return list(datasets.get_dataset_split_names(source.path, source.subset))
    except Exception:  # the source itself cannot be read: the caller reports the load error
        return None


def _load_gym(source: GymSource, excluded: set[str]) -> list[PromptRecord]:
    try:
        problems = procedural.draw(source, excluded)
    except ValueError as e:
        raise DataError(f"{source.label}: {e}") from None
    fields = FileSource(source.label, data_source=source.data_source)
    return [_to_record({"question": p.entry["question"], "gold_answer": procedural.gold_answer(p.entry)},
                       f"{source.label}: task {p.task}", fields) for p in problems]


def _to_record(row: Any, where: str, source: FileSource) -> PromptRecord:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    # an int answer reads as its digits (AIME sets store answers as ints); a float would lose its writing
    for name, kinds, expected in ((source.question, str, "a string"),
                                  (source.answer, (str, int), "a string or an integer")):
        if name not in row:
            raise DataError(f"{where}: field {name!r} is missing; the row has fields {', '.join(map(str, row))}")
        if not isinstance(row[name], kinds) or isinstance(row[name], bool):
            raise DataError(f"{where}: field {name!r} must be {expected}, got {type(row[name]).__name__} "
                            f"{row[name]!r}")
    question, answer = row[source.question], row[source.answer]
    gold = extract_answer(str(answer), source.extract)
    if gold is None:
        raise DataError(f"{where}: field {source.answer!r} has no {describe_extractor(source.extract)} "
                        f"(extract={source.extract!r}): ...{str(answer)[-60:]!r}")
    for name, text in ((source.question, question), (source.answer, gold)):  # a blank gold makes every sample -1
        if not text.strip():
            raise DataError(f"{where}: field {name!r} is empty")
    return PromptRecord(question, gold, _pass_rate(row, where), source.data_source)


def _pass_rate(row: dict, where: str) -> float | None:
    value = row.get("pass_rate")
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise DataError(f"{where}: field 'pass_rate' must be a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise DataError(f"{where}: field 'pass_rate' must be in [0, 1], got {value!r}")
    return float(value)


def balance_by_difficulty(
    records: Iterable[PromptRecord],
    balance_cfg: Sequence[tuple[tuple[float, float], int]] | None,
) -> list[PromptRecord]:
    """Re-weights records by pass rate exactly as the official trainer (reference 3.2).

    Each record goes to the first bucket ``((low, high), copies)`` with ``low <= pass_rate < high``
    and is repeated ``copies`` times, the copies adjacent; a record in no bucket is dropped.
    An empty or None config returns the records unchanged.

    Raises:
        DataError: balancing is asked for but some record has no pass rate.
    """
    records = list(records)
    if not balance_cfg:
        return records
    unrated = [r for r in records if r.pass_rate is None]
    if unrated:
        raise DataError(f"{len(unrated)} of {len(records)} prompt records have no pass_rate (first: "
                        f"{unrated[0].question[:60]!r}); difficulty balancing (data_difficulty_balance_cfg) "
                        "needs one per record: add a pass_rate field, or set data_difficulty_balance_cfg = None")
    balanced = []
    for record in records:
        for (low, high), copies in balance_cfg:
            if low <= record.pass_rate < high:
                balanced.extend([record] * copies)
                break
    return balanced
