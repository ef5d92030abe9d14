"""Problems from reasoning-gym's procedural generators (``pip install 'oreal-fast[reasoning-gym]'``).

reasoning-gym builds item ``i`` of a task from Python's ``Random(seed + i)``, so two sets whose seeds differ
by one share every item but one. A source's ``seed`` s therefore selects the generator seed
``s * SEED_STRIDE mod 2**32``: sets of different seeds draw from index ranges ``SEED_STRIDE`` apart. On top
of that, questions already drawn or listed in ``excluded`` are skipped and drawing goes on, so a set has
exactly the asked number of distinct questions and a held-out set built with ``exclude`` shares none with
its training set, even for a task whose question space is small.

What it does not do: judge (the gold answers go to the rule judger; docs/reasoning_gym.md compares its
verdicts with each task's own ``score_answer``) or turn problems into prompt records (``prompts.py``).

Invariant: :func:`draw` is a function of the source and the installed reasoning-gym version: the same
tasks, sizes, options and seed give the same questions in the same order.
"""

from __future__ import annotations

import dataclasses
import decimal
import difflib
from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

SEED_STRIDE = 2**20  # generator indices reserved per seed; > DRAW_FACTOR * MAX_TASK_SIZE + DRAW_SLACK
DRAW_FACTOR = 4  # draws allowed per wanted question: duplicates and excluded questions are skipped
DRAW_SLACK = 100  # so that tiny sets of a task with a small question space still find their questions
MAX_TASK_SIZE = 200_000
INSTALL_HINT = "pip install 'oreal-fast[reasoning-gym]'"


def gold_answer(entry: dict[str, Any]) -> Any:
    """The entry's answer as a gold answer for our judger: a str answer in inline math (``$\\frac{1}{2}$``, as
    fraction_simplification writes some) loses its ``$`` pair, which the official rule checker strips from the
    response's answer but not from the gold (so it would reject the gold answer itself)."""
    answer = entry["answer"]
    if isinstance(answer, str) and len(answer) > 2 and answer[0] == answer[-1] == "$" and "$" not in answer[1:-1]:
        return answer[1:-1]
    return answer


@dataclasses.dataclass(frozen=True)
class GymTask:
    """One reasoning-gym task: its registered name, how many distinct problems, generator options."""

    name: str
    size: int
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


class GymTasks(Protocol):
    """What drawing reads of a source (``sources.GymSource``): its tasks and its seed."""

    tasks: tuple[GymTask, ...]
    seed: int


class Problem(NamedTuple):
    """One drawn problem: its task, reasoning-gym's entry (question, answer, metadata), the task's dataset
    (whose ``score_answer(answer, entry)`` is the task's own checker)."""

    task: str
    entry: dict[str, Any]
    dataset: Any


def generator_seed(seed: int) -> int:
    """The reasoning-gym seed of a source seed (see the module docstring)."""
    return seed * SEED_STRIDE % 2**32


def _registry() -> dict[str, tuple[type, type]]:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ValueError(f"reasoning_gym sources need the 'reasoning-gym' package ({INSTALL_HINT})") from None
    return DATASETS


# Options under which a task's generator writes wrong gold answers: (task, option, value) -> why.
WRONG_ANSWER_OPTIONS = {
    ("basic_arithmetic", "allow_parentheses", False): (
        "its answers are computed as if the expression kept the parentheses it no longer shows "
        "('34 + 17 * 23' gets 1173, (34 + 17) * 23): about a third of the 2-digit, 3-term golds are "
        "wrong (reasoning-gym 0.1.25); keep the parentheses"),
}


def open_task(task: GymTask, seed: int, num_items: int) -> Any:
    """The task's reasoning-gym dataset with ``num_items`` items under the source seed ``seed``.

    Raises:
        ValueError: the package is missing, the task is unknown, an option is unknown or out of range,
            or it is one of `WRONG_ANSWER_OPTIONS`.
    """
    registry = _registry()
    if task.name not in registry:
        close = difflib.get_close_matches(task.name, list(registry), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see reasoning_gym.factory.DATASETS"
        raise ValueError(f"reasoning_gym has no task {task.name!r}; {hint}")
    dataset_cls, config_cls = registry[task.name]
    names = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    unknown = sorted(set(task.options) - set(names))
    if unknown:
        raise ValueError(f"reasoning_gym task {task.name!r} has no option {unknown[0]!r}; its options: "
                         f"{', '.join(names)}")
    for (name, option, value), why in WRONG_ANSWER_OPTIONS.items():
        if task.name == name and option in task.options and task.options[option] == value:
            raise ValueError(f"reasoning_gym task {name!r} with {option}={value!r}: {why}")
    try:  # the dataset validates its config (with assert) where the task defines a check
        return dataset_cls(config=config_cls(**task.options, seed=generator_seed(seed), size=num_items))
    except (AssertionError, ValueError, TypeError) as e:
        raise ValueError(f"reasoning_gym task {task.name!r}: bad options {task.options}: {e}") from None


def check(source: GymTasks) -> None:
    """Start-up check: the package, each task and its options (builds each generator, draws nothing).

    Raises:
        ValueError: as :func:`open_task`.
    """
    for task in source.tasks:
        open_task(task, source.seed, 1)


def draw(source: GymTasks, excluded: Iterable[str] = ()) -> list[Problem]:
    """Each task's first ``size`` distinct questions not in ``excluded``, interleaved round-robin in task
    order (a task with more problems continues alone once the others are done).

    Raises:
        ValueError: as :func:`open_task`, or a task with fewer such questions than asked within
            ``DRAW_FACTOR * size + DRAW_SLACK`` draws.
    """
    seen = set(excluded)
    per_task = [_draw_task(task, source.seed, seen) for task in source.tasks]
    longest = max(len(p) for p in per_task)
    return [p[i] for i in range(longest) for p in per_task if i < len(p)]


def _draw_task(task: GymTask, seed: int, seen: set[str]) -> list[Problem]:
    num_draws = DRAW_FACTOR * task.size + DRAW_SLACK
    dataset = open_task(task, seed, num_draws)
    problems = []
    for i in range(num_draws):
        with decimal.localcontext():  # decimal_arithmetic sets the process-wide decimal precision per item
            entry = dataset[i]
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        problems.append(Problem(task.name, entry, dataset))
        if len(problems) == task.size:
            return problems
    raise ValueError(f"task {task.name!r} gave only {len(problems)} distinct new questions in {num_draws} draws "
                     f"(size {task.size}); ask for fewer or widen its options")
