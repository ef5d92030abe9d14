"""Reward functions for the reward_fn tests, run by the judge workers as ``reward_fns:<name>``. A plain
module (not conftest.py) so that the workers can import it, as ``cpu_load``."""

import time


def weighted_match(record: dict, response: str, gold: str) -> float | bool:
    """``record["weight"]`` times the response's length if the gold answer is in it, else False (-1)."""
    return record["weight"] * len(response) if gold in response else False


def by_question(record: dict, response: str, gold: str) -> object:
    """What the question asks for: 0.25, an exception, a busy loop, or a value that is not a reward."""
    kind = record["question"]
    if kind == "raise":
        raise KeyError("no such answer")
    if kind == "hang":
        while True:  # pure CPU: only the CPU-time limit ends it
            time.process_time()
    bad = {"str": "0.5", "none": None, "nan": float("nan"), "inf": float("-inf"), "list": [1.0]}
    return bad.get(kind, 0.25)


def two_arguments(record: dict, response: str) -> float:
    return 1.0
