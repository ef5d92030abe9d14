"""A reward function of your own in place of the math judger: loading, start-up checks, one call.

What it does: `check_reward_fn(spec)` loads ``"package.module:function"`` or
``"path/to/file.py:function"`` and checks that it takes ``(record, response, gold_answer)``, for the
config's start-up validation; `load_function(spec)` loads either form (the judge workers call it once
per worker: a file is loaded by its path, so it needs to be on no import path); `call_reward_fn`
makes one call and turns what came back into a `RewardAnswer`. A bool is a verdict (True -> +1,
False -> -1, as the rule judger scores); a real number is the reward as is once it is finite; anything
else (str, None, NaN, a list, a tensor...) is a failure with its reason, as is an exception.

What it does not: limit the call's time (the judge pool does, see pool.py) or count failures and turn
them into rewards (router.py).

Invariant: `call_reward_fn` never raises and its answer holds only floats and strs, so it always
crosses the worker's pipe, whatever the user's function does or returns.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

# A function that raised, ran past its CPU limit, or returned no usable reward: -1, as a rule check
# that fails and is not confirmed otherwise.
FAILED_REWARD = -1.0
FAILURE_KINDS = ("errors", "timeouts", "bad_returns")  # counted as judger_reward_fn_<kind>
_DETAIL_CHARS = 120  # of a bad return's repr in the one log line


class RewardTask(NamedTuple):
    """One call of a reward function, as the judge pool sends it to a worker."""

    spec: str  # "package.module:function" or "/abs/path/file.py:function"
    record: dict  # the prompt record: question, gold_answer, data_source, and its other fields
    response: str  # the decoded response, special tokens (the stop word) kept
    gold: str
    timeout_s: float  # CPU seconds the call may use


class RewardAnswer(NamedTuple):
    """What one call gave: a reward, or a failure kind of FAILURE_KINDS and a one-line reason."""

    reward: float | None
    failure: str | None
    detail: str


def split_spec(spec: str) -> tuple[str, str]:
    """``"target:name"`` -> (target, name); ValueError naming the two accepted forms otherwise."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError(f"{spec!r} is not of the form 'package.module:function' or 'path/to/file.py:function'")
    return target, name


def absolute_spec(spec: str) -> str:
    """The spec with a file path made absolute (from the current folder), so that it names the same
    file in every process whatever its working folder; a module spec unchanged."""
    target, name = split_spec(spec)
    return f"{os.path.abspath(os.path.expanduser(target))}:{name}" if target.endswith(".py") else spec


def load_function(spec: str) -> Callable[..., Any]:
    """The object named by ``"module:name"`` (imported) or ``"file.py:name"`` (loaded by path).

    Raises:
        ValueError: a malformed spec, a file that does not exist.
        AttributeError: the module has no such name.
        Exception: whatever importing the module or running the file raised.
    """
    target, name = split_spec(spec)
    module = _load_file(target) if target.endswith(".py") else importlib.import_module(target)
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"{target!r} has no attribute {name!r}") from None


def _load_file(path: str) -> Any:
    """Runs a .py file as a module of its own, registered in sys.modules under a name made from its
    path (classes and dataclasses defined in it look their module up there)."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise ValueError(f"file {path!r} does not exist")
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    name = f"_oreal_reward_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"  # one name per file
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def check_reward_fn(spec: str) -> str:
    """Loads a reward function in this process and checks that it can be called with
    ``(record, response, gold_answer)``.

    Args:
        spec: ``"package.module:function"`` or ``"path/to/file.py:function"`` (a relative path is
            read from the current folder).

    Returns:
        The spec with a file path made absolute (`absolute_spec`).

    Raises:
        ValueError: one line saying what is wrong: the form, a module that does not import, a file
            that does not exist or raises while it runs, a missing name, an object that is not
            callable, a signature that does not take the three arguments.
    """
    spec = absolute_spec(spec)
    target, name = split_spec(spec)
    try:
        fn = load_function(spec)
    except (ValueError, AttributeError) as e:
        raise ValueError(_one_line(str(e))) from None
    except BaseException as e:  # an import error, or anything the module raised while it ran
        what = "file" if target.endswith(".py") else "module"
        raise ValueError(_one_line(f"{what} {target!r} cannot be loaded: {type(e).__name__}: {e}")) from None
    if not callable(fn):
        raise ValueError(f"{spec!r} is a {type(fn).__name__}, not a function")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the call itself will tell
        return spec
    try:
        signature.bind({}, "", "")
    except TypeError:
        raise ValueError(f"{spec!r} must accept three positional arguments (record, response, gold_answer);"
                         f" its signature is {name}{signature}") from None
    return spec


def call_reward_fn(fn: Callable[..., Any], task: RewardTask) -> RewardAnswer:
    """One call ``fn(record, response, gold)`` and what it gave as a `RewardAnswer` (never raises)."""
    try:
        value = fn(task.record, task.response, task.gold)
    except BaseException as e:  # SystemExit and MemoryError too: the function gave no reward
        return RewardAnswer(None, "errors", _one_line(f"raised {type(e).__name__}: {e}"))
    try:
        return reward_of(value)
    except BaseException as e:  # a returned object whose float() or repr() raised
        return RewardAnswer(None, "bad_returns",
                            _one_line(f"returned a {type(value).__name__} that cannot be read: {type(e).__name__}: {e}"))


def reward_of(value: object) -> RewardAnswer:
    """A returned value as a reward: bool -> +1 / -1, a finite real number as is, else a failure.

    Raises whatever ``float(value)`` or ``repr(value)`` of an odd object raises (`call_reward_fn`
    catches it).
    """
    numpy = sys.modules.get("numpy")  # a numpy bool (np.isclose) comes only where numpy is loaded
    if isinstance(value, bool) or numpy is not None and isinstance(value, numpy.bool_):
        return RewardAnswer(1.0 if value else -1.0, None, "")
    if isinstance(value, numbers.Real):
        reward = float(value)
        if math.isfinite(reward):
            return RewardAnswer(reward, None, "")
        return RewardAnswer(None, "bad_returns", f"returned {reward} (a reward must be finite)")
    kind = type(value)
    type_name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    shown = repr(value)
    shown = shown if len(shown) <= _DETAIL_CHARS else shown[:_DETAIL_CHARS] + "..."
    return RewardAnswer(None, "bad_returns", _one_line(f"returned {type_name} {shown} (expected a float or a bool)"))


def _one_line(text: str) -> str:
    return " ".join(text.split())
