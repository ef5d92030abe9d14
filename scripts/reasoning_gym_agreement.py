"""How our rule judger's verdicts compare with reasoning-gym's own checkers (docs/reasoning_gym.md).

    python scripts/reasoning_gym_agreement.py [--problems 40] [--tasks gcd,chain_sum] [--out FILE.json]

For each task, ``--problems`` problems are drawn as a ``{"reasoning_gym": ..., "seed": 0}`` source draws them,
and each gold answer gives candidate answers: the gold as written, other writings of the same value
(``\\frac{a}{b}`` for ``a/b``, ``1,234`` for ``1234``, ``x = 5`` for ``5``, ...) and plausible wrong values
(off by one, sign, x100, a 0.001 % error, rounded to 3 significant figures, ...), and, where the question holds
an arithmetic expression, that expression itself (the calculation asked for instead of its value: what a
model learns to answer when a judge accepts it). Each candidate is judged by

- ours: the response ``... \\boxed{candidate}`` + stop word through ``oreal_fast.judge.Router`` with the judgers
  of ``--config`` (configs/demo.py: the rule-only math judger), once per rule mode (official, strict);
- the task's: ``dataset.score_answer(candidate, entry)``, what reasoning-gym scores the text inside its
  ``<answer>`` tags with; correct when the score is 1.0 (some tasks give partial credit below that).

Prints four Markdown tables: per task and rule mode, the samples, the agreement and the two kinds of
disagreement; for candidates of the gold's value and of another value, how often each judge accepts them;
the same per candidate kind; and one example of each kind of disagreement per task, mode and candidate kind.
``--out`` also writes them as JSON.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
from collections import Counter
from decimal import Context, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import NamedTuple

import fire

from oreal_fast.config import load_config
from oreal_fast.data.procedural import draw, gold_answer
from oreal_fast.data.sources import parse_source
from oreal_fast.judge import JudgeItem, Router

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("basic_arithmetic", "chain_sum", "decimal_chain_sum", "products", "gcd", "lcm", "gsm_symbolic",
         "simple_equations", "fraction_simplification", "decimal_arithmetic", "power_function",
         "complex_arithmetic")
RULE_MODES = ("official", "strict")

class Candidate(NamedTuple):
    """A candidate answer: how it was made, its text, whether it has the gold answer's value."""

    kind: str
    answer: str
    same_value: bool


_FRACTION = re.compile(r"(-?)(?:(\d+)/(\d+)|\\d?frac\{(\d+)\}\{(\d+)\})")
_COMPLEX = re.compile(r"(-?\d+(?:\.\d+)?) ([+-]) (\d+(?:\.\d+)?)i")
_VARIABLE = re.compile(r"Solve for (\w+)")
# A run of numbers, brackets and + - * / signs in a question ("Calculate -2 * (3 + 4).")
_EXPRESSION = re.compile(r"[-+*/()\d.\s]+")
_BINARY = re.compile(r"[\d)]\s*[-+*/]\s*[-+(]*\s*\d")


def _fmt(x: Decimal) -> str:
    """A Decimal in plain positional notation without trailing zeros (4.2E+3 -> 4200)."""
    return format(x.normalize(), "f") if x else "0"


def _number_candidates(gold: str, d: Decimal, question: str) -> list[Candidate]:
    out = []
    if "e" not in gold.lower():
        out.append(Candidate("trailing zero", gold + (".0" if "." not in gold else "0"), True))
    if abs(d) >= 1000:
        out.append(Candidate("thousands separators", format(d, ","), True))
    variable = _VARIABLE.search(question)
    if variable:
        out.append(Candidate("equation form", f"{variable[1]} = {gold}", True))
    values = [("off by one", d + 1), ("x100", d * 100), ("/100", d / 100), ("0.001 % off", d * Decimal("1.00001")),
              ("sign flipped", -d)]
    if d != d.to_integral_value():
        values += [("3 significant figures", Decimal(format(d, ".3g")))]
    out += [Candidate(kind, _fmt(x), x == d) for kind, x in values]
    if d != d.to_integral_value():
        rounded = Decimal(f"{float(d):.2e}")
        out.append(Candidate("e-notation, 3 significant figures", f"{float(d):.2e}", rounded == d))
    return out


def question_expression(question: str) -> tuple[str, Fraction] | None:
    """The longest arithmetic expression in the question, with its exact value; None if there is none."""
    runs = [m.group().strip().rstrip(".").strip() for m in _EXPRESSION.finditer(question)]
    runs = sorted((r for r in runs if _BINARY.search(r)), key=len, reverse=True)
    if not runs:
        return None
    try:
        return runs[0], _exact(ast.parse(runs[0], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _exact(node: ast.AST) -> Fraction:
    """Exact value of a +, -, *, / expression of number literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _exact(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _exact(node.left), _exact(node.right)
        ops = {ast.Add: a.__add__, ast.Sub: a.__sub__, ast.Mult: a.__mul__, ast.Div: a.__truediv__}
        return ops[type(node.op)](b)
    raise ValueError(f"not a number expression: {ast.dump(node)}")


def _fraction_candidates(gold: str, sign: str, a: int, b: int) -> list[Candidate]:
    value = Fraction(int(sign + str(a)), b)
    decimal = Decimal(value.numerator) / Decimal(value.denominator)
    terminating = _prime_factors(value.denominator) <= {2, 5}
    other = (Candidate("\\frac{a}{b}", f"{sign}\\frac{{{a}}}{{{b}}}", True) if "/" in gold
             else Candidate("a/b", f"{sign}{a}/{b}", True))
    return [
        other,
        Candidate("a / b with spaces", f"{sign}{a} / {b}", True),
        Candidate("not in lowest terms", f"{sign}{2 * a}/{2 * b}", True),
        Candidate("decimal", _fmt(decimal), True) if terminating
        else Candidate("decimal, 6 significant figures", format(decimal, ".6g"), False),
        Candidate("reciprocal", f"{sign}{b}/{a}", False),
        Candidate("numerator off by one", f"{sign}{a + 1}/{b}", False),
        Candidate("sign flipped", f"{'' if sign else '-'}{a}/{b}", False),
    ]


def _prime_factors(n: int) -> set[int]:
    factors, p = set(), 2
    while p * p <= n:
        while n % p == 0:
            factors.add(p)
            n //= p
        p += 1
    return factors | ({n} if n > 1 else set())


def _complex_candidates(re_part: str, op: str, im_part: str) -> list[Candidate]:
    re_d, im_d = Decimal(re_part), Decimal(im_part)
    return [
        Candidate("no spaces", f"{re_part}{op}{im_part}i", True),
        Candidate("without .0", f"{_fmt(re_d)} {op} {_fmt(im_d)}i", True),
        Candidate("j for i", f"{re_part} {op} {im_part}j", True),
        Candidate("conjugate", f"{re_part} {'-' if op == '+' else '+'} {im_part}i", False),
        Candidate("real part off by one", f"{_fmt(re_d + 1)} {op} {im_part}i", False),
    ]


def candidates(gold: str, question: str) -> list[Candidate]:
    """Candidate answers made from a gold answer; the first is the gold as written."""
    with localcontext(Context(prec=60)):  # exact sums and products of the golds' digits
        return _candidates(gold, question)


def _candidates(gold: str, question: str) -> list[Candidate]:
    out = [Candidate("as written", gold, True)]
    fraction, complex_number = _FRACTION.fullmatch(gold), _COMPLEX.fullmatch(gold)
    if fraction:
        a, b = (fraction[2], fraction[3]) if fraction[2] else (fraction[4], fraction[5])
        return out + _fraction_candidates(gold, fraction[1], int(a), int(b))
    if complex_number:
        return out + _complex_candidates(*complex_number.groups())
    try:
        d = Decimal(gold)
    except InvalidOperation:
        return out
    if not d.is_finite():
        return out
    out += [c for c in _number_candidates(gold, d, question) if c.answer != gold]  # x100 of 0 is 0
    expression = question_expression(question)
    if expression is not None:
        out.append(Candidate("the question's expression", expression[0], expression[1] == Fraction(gold)))
    return out


def _samples(tasks: list[str], problems: int) -> list[dict]:
    drawn = draw(parse_source({"reasoning_gym": dict.fromkeys(tasks, problems), "seed": 0}))
    samples = []
    for p in drawn:
        gold = str(gold_answer(p.entry))
        for c in candidates(gold, p.entry["question"]):
            with localcontext():  # a task's checker may set the process-wide decimal precision
                score = p.dataset.score_answer(c.answer, p.entry)
            samples.append({"task": p.task, "kind": c.kind, "same_value": c.same_value, "question": p.entry["question"],
                            "gold": gold, "answer": c.answer, "task_score": score, "task_correct": score == 1.0})
    return samples


def _judge(samples: list[dict], config: str) -> None:
    """Adds ``ours_<mode>`` (True = reward +1) to each sample, for each rule mode."""
    cfg = load_config(config)
    for mode in RULE_MODES:
        judgers = copy.deepcopy(cfg.judgers_config)
        for settings in judgers.values():
            settings["rule_mode"] = mode
        stop_word = next(iter(judgers.values())).get("stop_word", cfg.stop_word)
        items = [JudgeItem(s["question"], f"Working it out gives \\boxed{{{s['answer']}}}.{stop_word}", s["gold"])
                 for s in samples]
        with Router(judgers, cfg.data_judger_mapping) as router:
            rewards = router.judge(items).rewards
        for s, reward in zip(samples, rewards):
            s[f"ours_{mode}"] = reward > 0


def summarise(samples: list[dict]) -> tuple[list[dict], list[dict]]:
    """Per task and mode: counts; and one example per (task, mode, direction, kind) of disagreement."""
    rows, examples = [], []
    for task in dict.fromkeys(s["task"] for s in samples):
        of_task = [s for s in samples if s["task"] == task]
        row = {"task": task, "samples": len(of_task), "task_accepts": sum(s["task_correct"] for s in of_task)}
        for mode in RULE_MODES:
            ours_only = [s for s in of_task if s[f"ours_{mode}"] and not s["task_correct"]]
            task_only = [s for s in of_task if s["task_correct"] and not s[f"ours_{mode}"]]
            row[mode] = {"agree": len(of_task) - len(ours_only) - len(task_only),
                         "ours_accept_task_rejects": len(ours_only), "ours_reject_task_accepts": len(task_only)}
            for direction, group in (("ours accept, task rejects", ours_only),
                                     ("ours reject, task accepts", task_only)):
                counts = Counter(s["kind"] for s in group)
                for kind, n in counts.items():
                    first = next(s for s in group if s["kind"] == kind)
                    examples.append({"task": task, "mode": mode, "direction": direction, "kind": kind, "count": n,
                                     "same_value": first["same_value"], "gold": first["gold"], "answer": first["answer"],
                                     "task_score": round(first["task_score"], 4)})
        rows.append(row)
    return rows, examples


def by_kind(samples: list[dict]) -> list[dict]:
    """Per candidate kind and value (the same kind may keep the value: 1.50 rounded is 1.5), over all tasks:
    how often each judge accepts it."""
    rows = []
    for kind, same in dict.fromkeys((s["kind"], s["same_value"]) for s in samples):
        group = [s for s in samples if (s["kind"], s["same_value"]) == (kind, same)]
        rows.append({"kind": kind, "same_value": same, "samples": len(group),
                     "task_accepts": sum(s["task_correct"] for s in group),
                     **{f"{mode}_accepts": sum(s[f"ours_{mode}"] for s in group) for mode in RULE_MODES}})
    return rows


def _rates(row: dict) -> list[str]:
    return [f"{100 * row[key] / row['samples']:.0f} %" for key in ("task_accepts", "official_accepts",
                                                                    "strict_accepts")]


def by_value(samples: list[dict]) -> list[dict]:
    """Candidates of the gold's value and of another value: how often each judge accepts them."""
    rows = []
    for same, label in ((True, "the gold's value"), (False, "another value")):
        group = [s for s in samples if s["same_value"] is same]
        rows.append({"candidates": label, "samples": len(group), "task_accepts": sum(s["task_correct"] for s in group),
                     **{f"{mode}_accepts": sum(s[f"ours_{mode}"] for s in group) for mode in RULE_MODES}})
    return rows


def markdown(rows: list[dict], values: list[dict], kinds: list[dict], examples: list[dict]) -> str:
    def pct(row: dict, mode: str) -> str:
        return f"{100 * row[mode]['agree'] / row['samples']:.1f} %"

    lines = ["| task | samples | task accepts | official: agree | ours +, task − | ours −, task + "
             "| strict: agree | ours +, task − | ours −, task + |", "|---" * 9 + "|"]
    for r in rows:
        cells = [r["task"], r["samples"], r["task_accepts"]]
        for mode in RULE_MODES:
            cells += [pct(r, mode), r[mode]["ours_accept_task_rejects"], r[mode]["ours_reject_task_accepts"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "| candidates of | samples | task accepts | official accepts | strict accepts |", "|---" * 5 + "|"]
    for v in values:
        lines.append("| " + " | ".join(map(str, [v["candidates"], v["samples"], *_rates(v)])) + " |")
    lines += ["", "| candidate kind | same value | samples | task accepts | official accepts | strict accepts |",
              "|---" * 6 + "|"]
    for k in kinds:
        cells = [k["kind"], "yes" if k["same_value"] else "no", k["samples"], *_rates(k)]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "| task | mode | disagreement | candidate kind | same value | n | gold | candidate | task score |",
              "|---" * 9 + "|"]
    for e in examples:
        cells = [e["task"], e["mode"], e["direction"], e["kind"], "yes" if e["same_value"] else "no", e["count"],
                 f"`{e['gold']}`", f"`{e['answer']}`", e["task_score"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(problems: int = 30, tasks: str | tuple = ",".join(TASKS), config: str = os.path.join(REPO, "configs",
                                                                                               "demo.py"),
         out: str | None = None) -> None:
    """Draws the problems, judges every candidate both ways, prints the tables (and writes ``out``)."""
    task_list = list(tasks) if isinstance(tasks, tuple) else tasks.split(",")
    samples = _samples(task_list, problems)
    _judge(samples, config)
    rows, examples = summarise(samples)
    values, kinds = by_value(samples), by_kind(samples)
    print(markdown(rows, values, kinds, examples))
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"problems_per_task": problems, "config": config, "rows": rows, "values": values,
                       "kinds": kinds, "examples": examples}, f, indent=1)


if __name__ == "__main__":
    fire.Fire(main)
