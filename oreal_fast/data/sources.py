"""Prompt sources as a config writes them (``datasets``, ``val_datasets``): forms, start-up checks, answer extractors.

A source is one of:

- a string: a ``.jsonl`` file (or ``package://`` ref), a ``.json`` or ``.parquet`` file, or else a Hugging Face
  dataset id or local dataset folder (split ``train``); rows have ``question``, ``gold_answer`` and an optional
  ``pass_rate``;
- a dict with ``path``: the same files and datasets with their own ``split``, ``subset``, field names
  (``question``, ``answer``) and answer format (``extract``: ``plain``, ``gsm8k`` or ``boxed``);
- a dict with ``reasoning_gym``: problems drawn from reasoning-gym's generators (``procedural.py``).

Either dict may also give ``data_source`` (the judger route, default ``math``) and ``exclude`` (sources whose
questions are dropped from this one: a held-out set never repeats a training question).

What it does not do: read rows (``prompts.py``) or generate problems (``procedural.py``).

Invariant: :func:`parse_sources` returns sources with known keys and well-typed values, or raises ValueError
with one line that names the source and the key; :func:`check_sources` adds what can be checked without
reading any row (local files exist, optional packages are installed, reasoning-gym tasks and options exist).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Any

from oreal_fast.data import procedural
from oreal_fast.data.procedural import GymTask
from oreal_fast.package_refs import is_package_ref, resolve_package_ref

EXTRACTORS = ("plain", "gsm8k", "boxed")
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")  # a path ending so is one local file, else a dataset id/folder
DEFAULT_DATA_SOURCE = "math"  # the official trainer's only data_source; routes to math_judger
MAX_TASK_SIZE = procedural.MAX_TASK_SIZE


@dataclass(frozen=True)
class FileSource:
    """Rows of a local file, a local dataset folder or a Hugging Face dataset."""

    path: str
    split: str | None = None  # None: the only split of a file, "train" of a dataset
    subset: str | None = None  # the dataset's config name (GSM8K's "main"); None = its default
    question: str = "question"
    answer: str = "gold_answer"
    extract: str = "plain"
    data_source: str = DEFAULT_DATA_SOURCE
    exclude: tuple[Source, ...] = ()

    @property
    def is_file(self) -> bool:
        """One local file (read whole), as opposed to a dataset id or folder with splits."""
        return self.path.endswith(LOCAL_SUFFIXES)

    @property
    def label(self) -> str:
        """How messages name the source: its path, and its subset and split when given."""
        parts = [f"{k} {v}" for k, v in (("subset", self.subset), ("split", self.split)) if v is not None]
        return f"{self.path} ({', '.join(parts)})" if parts else self.path


@dataclass(frozen=True)
class GymSource:
    """Problems drawn from reasoning-gym generators, interleaved task by task."""

    tasks: tuple[GymTask, ...]
    seed: int = 0
    data_source: str = DEFAULT_DATA_SOURCE
    exclude: tuple[Source, ...] = ()

    @property
    def label(self) -> str:
        return f"reasoning_gym {'+'.join(t.name for t in self.tasks)} (seed {self.seed})"


Source = FileSource | GymSource

_FILE_KEYS = ("path", "split", "subset", "question", "answer", "extract", "data_source", "exclude")
_GYM_KEYS = ("reasoning_gym", "size", "seed", "data_source", "exclude")


def parse_sources(value: Any) -> list[Source]:
    """One source or a list of them, as ``datasets`` / ``val_datasets`` hold them.

    Raises:
        ValueError: an empty list, or a source of the wrong form (the message names it and the key).
    """
    items = [value] if isinstance(value, (str, dict)) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"expected a source (a str or a dict) or a non-empty list of them, got {value!r}")
    return [parse_source(item, f"entry {i}: " if len(items) > 1 else "") for i, item in enumerate(items)]


def parse_source(item: Any, where: str = "") -> Source:
    """One source; ``where`` prefixes error messages (e.g. ``"entry 2: "``)."""
    if isinstance(item, str):
        if not item:
            raise ValueError(f"{where}an empty string is not a source")
        return FileSource(item)
    if not isinstance(item, dict):
        raise ValueError(f"{where}expected a str or a dict, got {type(item).__name__} {item!r}")
    if "reasoning_gym" in item and "path" in item:
        raise ValueError(f"{where}a source has either 'path' or 'reasoning_gym', not both: {item!r}")
    if "reasoning_gym" in item:
        return _parse_gym(item, where)
    if "path" not in item:
        raise ValueError(f"{where}a dict source needs 'path' (a file, folder or dataset id) or 'reasoning_gym' "
                         f"(task names); got keys {sorted(map(str, item))}")
    return _parse_file(item, where)


def _check_keys(item: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in item:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (allowed: {', '.join(allowed)})"
            raise ValueError(f"{where}unknown key {key!r}{hint}")


def _parse_file(item: dict, where: str) -> FileSource:
    _check_keys(item, _FILE_KEYS, where)
    for key, value in item.items():
        if key != "exclude" and not (isinstance(value, str) and value):
            raise ValueError(f"{where}{key!r} must be a non-empty str, got {value!r}")
    if item.get("extract", "plain") not in EXTRACTORS:
        raise ValueError(f"{where}'extract' must be one of {', '.join(EXTRACTORS)}; got {item['extract']!r}")
    source = FileSource(**{k: v for k, v in item.items() if k != "exclude"}, exclude=_parse_exclude(item, where))
    for key in ("split", "subset"):
        if source.is_file and getattr(source, key) is not None:
            raise ValueError(f"{where}{source.path!r} is one local file, read whole: it has no {key}; remove "
                             f"{key!r} (or point 'path' at a dataset folder or id)")
    return source


def _parse_gym(item: dict, where: str) -> GymSource:
    _check_keys(item, _GYM_KEYS, where)
    seed = item.get("seed", 0)
    if not _is_int(seed) or not 0 <= seed < 2**32:
        raise ValueError(f"{where}'seed' must be an int in [0, 2**32), got {seed!r}")
    data_source = item.get("data_source", DEFAULT_DATA_SOURCE)
    if not (isinstance(data_source, str) and data_source):
        raise ValueError(f"{where}'data_source' must be a non-empty str, got {data_source!r}")
    return GymSource(_parse_tasks(item, where), seed, data_source, _parse_exclude(item, where))


def _parse_tasks(item: dict, where: str) -> tuple[GymTask, ...]:
    """``"name"`` or ``["a", "b"]`` with ``size`` (each), or ``{"a": size, "b": {"size": n, **options}}``."""
    tasks, size = item["reasoning_gym"], item.get("size")
    if isinstance(tasks, str):
        tasks = [tasks]
    if isinstance(tasks, (list, tuple)) and tasks and all(isinstance(t, str) and t for t in tasks):
        if size is None:
            raise ValueError(f"{where}'size' (problems per task) is required when 'reasoning_gym' lists names")
        tasks = dict.fromkeys(tasks, size)
    elif size is not None:
        raise ValueError(f"{where}'size' goes with a list of task names; with a dict, give each task its size")
    if not isinstance(tasks, dict) or not tasks or not all(isinstance(k, str) and k for k in tasks):
        raise ValueError(f"{where}'reasoning_gym' must be a task name, a list of names or a dict "
                         f"name -> size or name -> {{'size': n, option: value, ...}}; got {item['reasoning_gym']!r}")
    return tuple(_parse_task(name, spec, where) for name, spec in tasks.items())


def _parse_task(name: str, spec: Any, where: str) -> GymTask:
    options = dict(spec) if isinstance(spec, dict) else {"size": spec}
    size = options.pop("size", None)
    if not _is_int(size) or not 1 <= size <= MAX_TASK_SIZE:
        raise ValueError(f"{where}reasoning_gym task {name!r}: size must be an int in [1, {MAX_TASK_SIZE}], "
                         f"got {size!r}")
    if "seed" in options:
        raise ValueError(f"{where}reasoning_gym task {name!r}: give 'seed' once, beside 'reasoning_gym'")
    return GymTask(name, size, options)


def _parse_exclude(item: dict, where: str) -> tuple[Source, ...]:
    if "exclude" not in item:
        return ()
    try:
        return tuple(parse_sources(item["exclude"]))
    except ValueError as e:
        raise ValueError(f"{where}'exclude': {e}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_path(ref: str) -> str:
    """Turns ``package://<module>/<file>`` into the file's path inside that installed package.

    Other strings are returned unchanged. Raises ValueError if the package is not installed.
    """
    return resolve_package_ref(ref) if is_package_ref(ref) else ref


def check_sources(value: Any) -> list[Source]:
    """:func:`parse_sources`, then the checks that read no row: local files exist, ``datasets`` is
    installed where needed, and reasoning-gym tasks and options exist (the generators are built once).

    Raises:
        ValueError: one line naming the source and what is wrong.
    """
    sources = parse_sources(value)
    for source in _with_excluded(sources):
        if isinstance(source, GymSource):
            procedural.check(source)
        elif source.is_file:
            path = resolve_path(source.path)
            if not os.path.isfile(path):
                raise ValueError(f"file {path!r} does not exist")
        if _needs_datasets(source) and importlib.util.find_spec("datasets") is None:
            raise ValueError(f"{source.label!r} is read through the 'datasets' package, which is not installed "
                             "(pip install 'oreal-fast[datasets]'); .jsonl files need no extra package")
    return sources


def _with_excluded(sources: list[Source]) -> list[Source]:
    """The sources and, recursively, those of their ``exclude``."""
    out = []
    for source in sources:
        out += [source, *_with_excluded(list(source.exclude))]
    return out


def _needs_datasets(source: Source) -> bool:
    return isinstance(source, FileSource) and not source.path.endswith(".jsonl")


# ----------------------------------------------------------------------------- answer extractors

_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_answer(text: str, how: str) -> str | None:
    """The gold answer inside an answer field; None when the field has none in that format.

    Args:
        text: the field's value.
        how: ``plain`` (the value itself), ``gsm8k`` (what follows the last ``####``, thousands separators
            removed: ``#### 1,200`` -> ``1200``) or ``boxed`` (the content of the last ``\\boxed{...}`` or
            ``\\fbox{...}``, nested braces kept).
    """
    if how == "plain":
        return text
    if how == "gsm8k":
        if "####" not in text:
            return None
        final = text.rsplit("####", 1)[1].strip()
        return final.replace(",", "") if _THOUSANDS.fullmatch(final) else final
    if how == "boxed":
        return _last_boxed(text)
    raise ValueError(f"unknown extractor {how!r}; one of {', '.join(EXTRACTORS)}")


def _last_boxed(text: str) -> str | None:
    opens = list(_BOX_OPEN.finditer(text))
    if not opens:
        return None
    start = opens[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None  # unbalanced: the box never closes


def describe_extractor(how: str) -> str:
    """What an extractor expects, for error messages."""
    return {"gsm8k": "final '#### N'", "boxed": "\\boxed{...}"}.get(how, "value")

