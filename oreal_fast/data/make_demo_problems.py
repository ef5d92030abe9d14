"""Writes the demo prompt set ``oreal_fast/assets/demo_problems.jsonl`` and its held-out
validation set ``demo_problems_val.jsonl`` (deterministic).

Run ``python -m oreal_fast.data.make_demo_problems`` to regenerate both byte for byte. The held-out
problems come from the same generator under another seed, skipping every training question, so no
question is in both files.
The problems are small arithmetic and one-step word problems that a 135M instruct model solves
some of the time, with plain-number gold answers. Their ``pass_rate`` values are **synthetic**:
a difficulty estimate from the operation and the size of the numbers, plus seeded noise,
rounded to sixteenths like the official dataset's (16 samples per question). They were not
measured with any model; they exist so that difficulty balancing has a spread to act on
(25 of the 320 land at >= 0.8 and are dropped by the official buckets).
"""

from __future__ import annotations

import argparse
import json
import os
import random

SEED = 20250211
NUM_PROBLEMS = 320
VAL_SEED = 20250212
NUM_VAL_PROBLEMS = 64
ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
DEFAULT_OUT = os.path.join(ASSETS, "demo_problems.jsonl")
DEFAULT_VAL_OUT = os.path.join(ASSETS, "demo_problems_val.jsonl")

NAMES = ["Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Zoe"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "coins", "cards"]


def _plain(rng: random.Random) -> tuple[str, int, float]:
    """A bare expression; difficulty grows with the operation and the operands."""
    kind = rng.choice(["add", "sub", "mul", "two_step"])
    if kind == "add":
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        return f"What is {a} + {b}?", a + b, 0.05 + 0.5 * (a + b) / 60
    if kind == "sub":
        a = rng.randint(5, 40)
        b = rng.randint(1, a)
        return f"What is {a} - {b}?", a - b, 0.15 + 0.5 * a / 40
    if kind == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        return f"What is {a} * {b}?", a * b, 0.25 + 0.5 * (a * b) / 108
    a, b, c = rng.randint(1, 9), rng.randint(2, 9), rng.randint(2, 6)
    return f"What is {a} + {b} * {c}?", a + b * c, 0.8


def _word(rng: random.Random) -> tuple[str, int, float]:
    """A one-step story problem; the extra reading makes each a little harder than its bare twin."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choice(["more", "give", "groups", "share"])
    if kind == "more":
        a, b = rng.randint(1, 15), rng.randint(1, 15)
        text = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"
        return text, a + b, 0.2 + 0.4 * (a + b) / 30
    if kind == "give":
        a = rng.randint(4, 25)
        b = rng.randint(1, a - 1)
        text = f"{name} has {a} {item} and gives {b} of them away. How many {item} are left?"
        return text, a - b, 0.3 + 0.4 * a / 25
    if kind == "groups":
        a, b = rng.randint(2, 9), rng.randint(2, 8)
        text = f"A box holds {a} {item}. How many {item} are in {b} boxes?"
        return text, a * b, 0.45 + 0.4 * (a * b) / 72
    b, q = rng.randint(2, 6), rng.randint(2, 8)
    text = f"{b * q} {item} are shared equally among {b} children. How many {item} does each child get?"
    return text, q, 0.6 + 0.3 * q / 8


def make_problems(num: int = NUM_PROBLEMS, seed: int = SEED, exclude: frozenset[str] = frozenset()) -> list[dict]:
    """Returns ``num`` distinct problems as {"question", "gold_answer", "pass_rate"} dicts, none of
    whose questions is in ``exclude``."""
    rng = random.Random(seed)
    seen: set[str] = set(exclude)
    problems = []
    while len(problems) < num:
        question, answer, difficulty = (_plain if rng.random() < 0.5 else _word)(rng)
        if question in seen:
            continue
        seen.add(question)
        noise = rng.uniform(-0.2, 0.2)
        sixteenths = round(16 * min(1.0, max(0.0, 1.0 - difficulty + noise)))
        problems.append({"question": question, "gold_answer": str(answer), "pass_rate": sixteenths / 16})
    return problems


def make_val_problems() -> list[dict]:
    """The held-out set: NUM_VAL_PROBLEMS problems under VAL_SEED, disjoint from make_problems()."""
    return make_problems(NUM_VAL_PROBLEMS, VAL_SEED, exclude=frozenset(p["question"] for p in make_problems()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output .jsonl path of the training set")
    parser.add_argument("--val_out", default=DEFAULT_VAL_OUT, help="output .jsonl path of the held-out set")
    args = parser.parse_args()
    for path, problems in ((args.out, make_problems()), (args.val_out, make_val_problems())):
        with open(path, "w", encoding="utf-8") as f:
            for problem in problems:
                f.write(json.dumps(problem) + "\n")


if __name__ == "__main__":
    main()
