"""A correct rule checker: math-verify's parser and comparison plus our normalisation.

What it does: `check(text, gold)` extracts the final answer from a post-processed response
with math-verify (the ``\\boxed{}`` contents, several of them forming one answer, else "final
answer is", else the last LaTeX/expression) and compares it to the gold answer by value: no
percentage leniency (4200 is not 42), exact big-integer comparison (2^{2020} is not 2^{2019}),
units, degrees, ``%``, ``\\$`` and ``\\text{}`` wrappers ignored on both sides, matrices,
intervals, sets and tuples compared as objects. A number is answered with a number: when the gold
is a plain number, an answer whose last side is still a sum, difference or product of numbers (or
a division written with ``\\div``, or for an integer gold any fraction) fails, since it is the
calculation asked for and not its value (``\\boxed{64942 \\times 63126}``, ``3 + 4``, ``69/3`` for
23); a power, a root, scientific notation and a fraction for a non-integer gold are values. Gold
answers are wrapped in ``$...$`` so that math-verify reads them as LaTeX; word answers (names,
days) also match as case-insensitive text of the last ``\\boxed{}``.

Before that, both sides are normalised so that common right-answer forms parse (thousands
separators written as spaces, scientific notation, full-width digits, braceless or
unterminated boxes, answer sentences without a box; see strict_forms.py), and integer power
towers are compared exactly there. An answer sentence whose answer mixes words with math
("The answer is not 5.") fails the check rather than read the 5.

What it does not: it has no time limit of its own (math-verify's signal-based limits are
switched off because they only work in a main thread); callers run it in a worker process
that can be killed (see pool.py).

Invariant: `check` returns True only when the answer equals the gold; it never raises.
"""

import logging
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from oreal_fast.judge.strict_forms import (
    WORDS,
    box_answer_sentence,
    brace_boxes,
    normalise,
    towers_equal,
)

_GOLD_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
# math-verify warns on every call that its own time limit is off; ours is the worker kill.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def _gold_latex(gold: str) -> str:
    """Gold as one math-mode LaTeX string: dollar signs (math or currency) removed."""
    g = gold.strip().replace("\\$", "").replace("$", "")
    return f"${g}$"


def _word(s: str) -> str | None:
    """Lower-case text of a word answer ("\\text{Monday}." -> "monday"); None if not words."""
    s = _TEXT_WRAPPER.sub(r"\1", s).replace("$", "").strip().rstrip(".").strip()
    return s.lower() if WORDS.fullmatch(s) else None


def _box_content(text: str, start: int) -> str | None:
    """The contents of the ``\\boxed{`` at ``start``; None if it never closes."""
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    return None if start < 0 else _box_content(text, start)


def _boxed_contents(text: str) -> list[str]:
    contents = (_box_content(text, m.start()) for m in re.finditer(r"\\boxed\{", text))
    return [c for c in contents if c is not None]


# A gold answer that is one number: sign, digits (thousands commas), decimals, percent.
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)\s*(?:\\?%)?")
# m\times10^{k} (normalise writes 1.5e3 so): a value, not a product.
_SCIENTIFIC = re.compile(r"(\d)\s*(?:\\times|\\cdot|\*|×|·)\s*10\s*\^\s*(?:\{\s*[-+]?\d+\s*\}|[-+]?\d+)")
_INTEGER = re.compile(r"[-+]?\d[\d,]*(?:\.0*)?")
# A binary +, -, times or division sign between two operands (a number, a bracket, a command).
_OPERATION = re.compile(r"[\d)}]\s*(?:[-+*×·÷]|\\times|\\cdot|\\div)\s*[-+]?\s*[\d({.\\]")
# A fraction: a value for a gold such as 1.5, the division asked for when the gold is an integer.
_FRACTION = re.compile(r"[\d)}]\s*/\s*[-+]?\s*[\d({.\\]|\\[dt]?frac")


def _is_calculation(answer: str, integer_gold: bool) -> bool:
    """The answer's last side (after any ``=``) is an unevaluated arithmetic operation."""
    last_side = _SCIENTIFIC.sub(r"\1", answer.split("=")[-1])
    return _OPERATION.search(last_side) is not None or (integer_gold and _FRACTION.search(last_side) is not None)


def _answers_a_number_with_a_calculation(text: str, gold: str, extracted: object) -> bool:
    """The gold is a plain number and some boxed answer (else the extracted one) is a calculation."""
    gold = gold.replace("\\$", "").replace("$", "").strip()
    if not _PLAIN_NUMBER.fullmatch(gold):
        return False
    answers = _boxed_contents(text) or ([extracted] if isinstance(extracted, str) else [])
    return any(_is_calculation(a, _INTEGER.fullmatch(gold) is not None) for a in answers)


def _percent_forms(s: str) -> list[str]:
    """A value with a percent sign read both ways: as a unit (50) and as a number (50/100)."""
    if "%" not in s:
        return [s]
    base = s.replace("\\%", "").replace("%", "").strip()
    return [base, f"\\frac{{{base}}}{{100}}"]


def _equal(gold: str, answer: str) -> bool:
    g = parse(_gold_latex(gold), _GOLD_CONFIG, parsing_timeout=None)
    a = parse(_gold_latex(answer), _GOLD_CONFIG, parsing_timeout=None)
    return bool(g and a and verify(g, a, timeout_seconds=None))


def check(text: str, gold: str) -> bool:
    """True iff the final answer of `text` equals `gold` by value."""
    try:
        text = brace_boxes(normalise(text.replace("\\fbox{", "\\boxed{")))
        gold = normalise(str(gold))
        if "\\boxed" not in text:
            text = box_answer_sentence(text)
            if text is None:  # "The answer is not 5.": no answer to read
                return False
        boxed = _last_boxed(text) if text.count("\\boxed{") == 1 else None
        tower = None if boxed is None else towers_equal(gold, boxed)
        if tower is not None:  # exact; math-verify gives up on (or computes for hours on) these
            return tower
        g = parse(_gold_latex(gold), _GOLD_CONFIG, parsing_timeout=None)
        p = parse(text, parsing_timeout=None)
        if _answers_a_number_with_a_calculation(text, gold, p[-1] if p else None):
            return False
        if g and p and verify(g, p, timeout_seconds=None):
            return True
        # math-verify's own percent rule depends on its antlr grammar version: apply ours.
        answer = p[-1] if p and isinstance(p[-1], str) else None
        if answer is not None and ("%" in answer or "%" in gold):
            pairs = ((x, y) for x in _percent_forms(gold) for y in _percent_forms(answer))
            if any(_equal(x, y) for x, y in pairs):
                return True
        boxed = _last_boxed(text)
        return boxed is not None and _word(gold) is not None and _word(boxed) == _word(gold)
    except Exception:  # a parser bug on odd input is a failed check, not a crashed step
        return False
