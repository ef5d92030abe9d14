"""The config's reference, read from ``TrainConfig``'s own source: ``--help`` of the commands, the
``docs/config.md`` page and the resolved config a run saves.

Each key's meaning is the docstring under its field in ``config.py``, its group the ``# --- group ---``
comment above it, its type the field's annotation, its default the field's default (or the key whose
value it takes, ``config.DEFAULTS_FROM``), its allowed values ``config.CHOICES`` or ``config.AT_LEAST``
where the loader checks them. A command's own options (``CONFIG``, ``--smoke``, eval's ``--k`` ...)
are its function's parameters, described by the ``Args:`` section of that function's docstring.
Nothing is copied, so the help and the page cannot drift from the code:
``python -m oreal_fast.config_doc > docs/config.md`` regenerates the page (a test compares them).

What it does not do: check values (``config.py`` does) or parse the command line (python-fire does,
after `handle_help` has taken ``--help``).
Invariant: every field of ``TrainConfig`` but ``config_path`` (the loader sets it) is documented here,
in the order of its source; a field without a docstring is an error, not a gap.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import os
import re
import sys
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oreal_fast.config import AT_LEAST, CHOICES, COMPATIBILITY_ONLY, DEFAULTS_FROM, TrainConfig

HELP_FLAGS = ("--help", "-h")
_GROUP = re.compile(r"^\s*#\s*---\s*(.+?)\s*---\s*$")
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z0-9])")  # not "e.g. 40", "0.5", "pass@1."
_WIDTH = 100
_SHORT = 160  # a docstring up to this long is its own summary
_PROMPT_FILES = """\
## Prompt files

A `.jsonl` prompt file (for `datasets` or `val_datasets`) holds one JSON object per line:

```json
{"question": "What is 17 + 25?", "gold_answer": "42", "pass_rate": 0.25}
```

| field | required | meaning |
| --- | --- | --- |
| `question` | yes | the problem, a non-empty string; the chat template renders it as the one user message |
| `gold_answer` | yes | the reference answer the judger compares with, a non-empty string (an integer becomes its digits) |
| `pass_rate` | only with difficulty balancing | the share of samples of the starting model that were right, in [0, 1]; read only by `data_difficulty_balance_cfg`, which stops at start-up with one line when a record lacks it (set `data_difficulty_balance_cfg = None` for data without pass rates) |

Other fields are ignored. JSON and parquet files, Hugging Face datasets with their own field names and
splits, and generated problems are described in [datasets.md](datasets.md). The data is read and checked
before any model loads.
"""


@dataclass(frozen=True)
class KeyDoc:
    """One config key as the reference shows it.

    Attributes:
        name: the key.
        group: the title of the ``# --- ... ---`` group it is in.
        doc: its docstring, dedented (several lines).
        type_text: its annotation, as written in Python (``int | None``).
        default_text: its default as a Python literal, ``required``, or ``the value of KEY``.
        allowed_text: the allowed values (``auto | cpu | cuda``, ``int >= 1``), else its type.
    """

    name: str
    group: str
    doc: str
    type_text: str
    default_text: str
    allowed_text: str

    @property
    def summary(self) -> str:
        """The docstring on one line when it is short, else its first sentence and where the rest is."""
        text = " ".join(self.doc.split())
        return text if len(text) <= _SHORT else f"{first_sentence(text)} (more: --help {self.name})"


def first_sentence(doc: str) -> str:
    """The first sentence of ``doc`` on one line (a sentence ends at ". " before a capital or a digit)."""
    text = " ".join(doc.split())
    end = _SENTENCE_END.search(text)
    return text[: end.start() + 1] if end else text


# ----------------------------------------------------------------------------- the keys


@functools.cache
def config_keys() -> tuple[KeyDoc, ...]:
    """Every settable key of ``TrainConfig`` in source order, with its group, docstring, type, default
    and allowed values.

    Raises:
        RuntimeError: a field without a docstring under it.
    """
    source = textwrap.dedent(inspect.getsource(TrainConfig))
    lines = source.splitlines()
    node = ast.parse(source).body[0]
    hints = typing.get_type_hints(TrainConfig)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    keys = []
    for stmt, after in zip(node.body, node.body[1:] + [None]):
        if not isinstance(stmt, ast.AnnAssign) or stmt.target.id == "config_path":
            continue
        name = stmt.target.id
        is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)
        if not is_doc:
            raise RuntimeError(f"{TrainConfig.__name__}.{name} has no docstring under it; every key needs one")
        group = next((m.group(1) for line in reversed(lines[: stmt.lineno - 1]) if (m := _GROUP.match(line))), "")
        type_text = _type_text(hints[name])
        keys.append(KeyDoc(name, group, inspect.cleandoc(after.value.value), type_text,
                           _default_text(fields[name]), _allowed_text(name, hints[name], type_text)))
    return tuple(keys)


def _type_text(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _default_text(f: dataclasses.Field) -> str:
    if f.name in DEFAULTS_FROM and f.default is None:
        return f"the value of {DEFAULTS_FROM[f.name]}"
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "required"


def _allowed_text(name: str, hint: Any, type_text: str) -> str:
    if name in CHOICES:
        return " | ".join(CHOICES[name])
    if name in AT_LEAST:
        optional = type(None) in typing.get_args(hint)
        return f"int >= {AT_LEAST[name]}" + (" or None" if optional else "")
    return type_text


def config_key(name: str) -> KeyDoc | None:
    """The key ``name``, or None when there is no such key."""
    return next((k for k in config_keys() if k.name == name), None)


def _grouped(keys: tuple[KeyDoc, ...]) -> list[tuple[str, list[KeyDoc]]]:
    groups: dict[str, list[KeyDoc]] = {}
    for key in keys:
        groups.setdefault(key.group, []).append(key)
    return list(groups.items())


def _title(group: str) -> str:
    return group[:1].upper() + group[1:]


# ----------------------------------------------------------------------------- a command's own options


@dataclass(frozen=True)
class OptionDoc:
    """One parameter of a command's function: positional (no default) or ``--name``."""

    name: str
    doc: str
    type_text: str
    default: Any
    positional: bool

    @property
    def flag(self) -> str:
        return self.name.upper() if self.positional else f"--{self.name}"


def command_options(command: Callable, hidden: tuple[str, ...] = ()) -> list[OptionDoc]:
    """The parameters of ``command`` (but ``hidden`` ones and ``**kwargs``) with their types and their
    descriptions from the ``Args:`` section of its docstring; an undocumented one says so."""
    described = _args_section(inspect.getdoc(command) or "")
    options = []
    for p in inspect.signature(command).parameters.values():
        if p.name in hidden or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        doc = described.get(p.name, f"(not described in the docstring of {command.__module__}.{command.__name__})")
        positional = p.default is inspect.Parameter.empty
        type_text = p.annotation if isinstance(p.annotation, str) else _type_text(p.annotation)
        options.append(OptionDoc(p.name, doc, type_text, None if positional else p.default, positional))
    return options


def takes_config_keys(command: Callable) -> bool:
    """Whether ``command`` takes any config key as ``**overrides``."""
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(command).parameters.values())


def _args_section(doc: str) -> dict[str, str]:
    """Google-style ``Args:`` entries: name -> text (continuation lines joined)."""
    entries: dict[str, str] = {}
    lines = doc.splitlines()
    if "Args:" not in (line.strip() for line in lines):
        return entries
    start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    name = None
    for line in lines[start + 1:]:
        depth = len(line) - len(line.lstrip())
        if line.strip() and depth <= indent:
            break  # the next section (Returns:, Raises:, ...)
        m = re.match(r"\s*\**(\w+)(?: \([^)]*\))?:\s*(.*)", line)  # "**overrides:" is an entry too
        if m and depth == indent + 4:
            name = m.group(1)
            entries[name] = m.group(2)
        elif name is not None and line.strip():
            entries[name] += " " + line.strip()
    return entries


# ----------------------------------------------------------------------------- --help


def help_request(argv: list[str]) -> tuple[bool, str | None]:
    """Whether ``argv`` asks for help (``--help``, ``-h``, ``--help KEY``, ``--help=KEY``) and for which key."""
    for i, arg in enumerate(argv):
        if arg.startswith("--help="):
            return True, arg.split("=", 1)[1].lstrip("-")
        if arg in HELP_FLAGS:
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is not None and (not following.startswith("-") or config_key(following.lstrip("-"))):
                return True, following.lstrip("-")
            return True, None
    return False, None


def handle_help(argv: list[str], prog: str, command: Callable, about: str, hidden: tuple[str, ...] = ()) -> bool:
    """Prints the help ``argv`` asks for and returns True; returns False when it asks for none.

    ``--help`` lists the command's options (``command``'s parameters) and, when it takes ``**overrides``,
    every config key by group; ``--help KEY`` shows one option or key in full. ``hidden`` names
    parameters and config keys the command sets itself (they are not listed). An unknown KEY prints
    one line to stderr and exits with code 2.
    """
    asked, name = help_request(argv)
    if not asked:
        return False
    options = command_options(command, hidden)
    keys = _settable_keys(command, options, hidden)
    if name is None:
        _print(full_help(prog, options, about, keys))
        return True
    own = next((o for o in options if o.name == name), None)
    key = next((k for k in keys if k.name == name), None)
    if own is None and key is None:
        names = [o.name for o in options] + [k.name for k in keys]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"{prog}: --help {name}: no such option or config key{hint} (--help alone lists them all)",
              file=sys.stderr)
        sys.exit(2)
    _print(option_help(own) if own is not None else key_help(key))
    return True


def _print(text: str) -> None:
    """Prints to stdout; a reader that closes the pipe early (``--help | head``) ends it quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def _settable_keys(command: Callable, options: list[OptionDoc], hidden: tuple[str, ...]) -> tuple[KeyDoc, ...]:
    """The config keys ``command`` takes as ``--KEY VALUE``: none without ``**overrides``; else all
    but ``hidden`` ones and those a parameter of the same name takes over."""
    if not takes_config_keys(command):
        return ()
    taken = set(hidden) | {o.name for o in options}
    return tuple(k for k in config_keys() if k.name not in taken)


def full_help(prog: str, options: list[OptionDoc], about: str, keys: tuple[KeyDoc, ...]) -> str:
    """The usage lines, ``about``, the command's options, then the config ``keys`` it takes, by group,
    each with its allowed values, default and one-line meaning."""
    positional = " ".join(o.flag for o in options if o.positional)
    flags = "".join(f" [{o.flag}]" if isinstance(o.default, bool) else f" [{o.flag} VALUE]"
                    for o in options if not o.positional)
    usage = f"usage: python -m {prog} {positional}{flags}{' [--KEY VALUE ...]' if keys else ''}"
    out = [usage, f"       python -m {prog} --help [KEY]", "", _wrap(about, 0), "", "options:"]
    for o in options:
        out += [f"  {o.flag}" if o.positional else f"  {o.flag}  {o.type_text}  (default {o.default!r})", _wrap(o.doc, 6)]
    out.append(f"  --help [KEY]\n{_wrap('This list, or one option or config key in full.', 6)}")
    if keys:
        out += ["", _wrap("config keys, grouped as config.py groups them: set them in the config file or override one "
                          "with --KEY VALUE (VALUE is read as a Python literal: --total_steps 90, --token_level_rm "
                          "None, --datasets '[\"a.jsonl\"]'); --help KEY shows one in full; reference: "
                          "docs/config.md.", 0)]
        for group, members in _grouped(keys):
            out += ["", _title(group)]
            for k in members:
                default = "required" if k.default_text == "required" else f"default {k.default_text}"
                out += [f"  --{k.name}  {k.allowed_text}  ({default})", _wrap(k.summary, 6)]
    return "\n".join(out)


def option_help(option: OptionDoc) -> str:
    """One command option in full."""
    default = "positional, required" if option.positional else f"default {option.default!r}"
    return f"{option.flag}  {option.type_text}  ({default})\n{_wrap(option.doc, 4)}"


def key_help(key: KeyDoc) -> str:
    """One config key in full: group, type, allowed values, default, the whole docstring and the notes
    the loader applies to it."""
    out = [f"--{key.name}  (group: {key.group})", f"    type:     {key.type_text}"]
    if key.allowed_text != key.type_text:
        out.append(f"    allowed:  {key.allowed_text}")
    out += [f"    default:  {key.default_text}", ""]
    out += [textwrap.indent(paragraph, "    ") for paragraph in _paragraphs(key.doc)]
    if key.name in COMPATIBILITY_ONLY:
        value, what = COMPATIBILITY_ONLY[key.name]
        out += ["", _wrap(f"An official key kept so that official configs load; it has no effect here ({what}); "
                          f"a value other than {value!r} gets one line in the run's log.", 4)]
    return "\n".join(out)


def _paragraphs(doc: str) -> list[str]:
    return [textwrap.fill(" ".join(p.split()), _WIDTH - 4) for p in doc.split("\n\n")]


def _wrap(text: str, indent: int) -> str:
    return textwrap.fill(" ".join(text.split()), _WIDTH, initial_indent=" " * indent,
                         subsequent_indent=" " * indent)


# ----------------------------------------------------------------------------- docs/config.md


def markdown() -> str:
    """``docs/config.md``: the prompt-file format, then every key by group with its default, allowed
    values and whole docstring."""
    out = ["# Config reference", "",
           "<!-- Generated from the field docstrings of oreal_fast/config.py by "
           "`python -m oreal_fast.config_doc > docs/config.md`; do not edit by hand. -->", "",
           "A config file is plain Python: every module-level name is a key (`actor = \"Qwen/Qwen2.5-0.5B-Instruct\"`); "
           "`python -m oreal_fast.train CONFIG --KEY VALUE` overrides one (VALUE is read as a Python literal), "
           "`python -m oreal_fast.train --help KEY` prints one key in full. Each run saves its resolved config, "
           "every key after the overrides, as `config.py` in its run folder.", "",
           _PROMPT_FILES]
    for group, keys in _grouped(config_keys()):
        out += [f"## {_title(group)}", "", "| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{k.name}` | {_cell(k.default_text, code=_is_literal(k.default_text))} "
                f"| {_cell(k.allowed_text, code=True)} | {_cell(k.doc)} |" for k in keys]
        out.append("")
    return "\n".join(out)


def _is_literal(default_text: str) -> bool:
    return default_text != "required" and not default_text.startswith("the value of ")


def _cell(text: str, code: bool = False) -> str:
    text = " ".join(text.split())
    return f"`{text}`".replace("|", "\\|") if code else text.replace("|", "\\|")


# ----------------------------------------------------------------------------- the run's saved config


def config_file_text(cfg: TrainConfig, origin: str) -> str:
    """``cfg`` as a config file that loads back to the same values: every key by group, one
    ``key = value`` line each (values as Python literals), under a header naming ``origin``."""
    values = cfg.to_dict()
    out = [f"# The resolved config of {origin}: every key after the command-line overrides, defaults filled in.",
           f"# Loaded from {cfg.config_path}. The same settings again: python -m oreal_fast.train THIS_FILE"]
    for group, keys in _grouped(config_keys()):
        out += ["", f"# --- {group} ---"]
        out += [f"{k.name} = {values[k.name]!r}" for k in keys]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
