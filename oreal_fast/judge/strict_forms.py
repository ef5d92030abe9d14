"""Answer forms the strict checker reads before math-verify sees the text, and power towers.

What it does, each step a pure str -> str rewrite (rule_strict.py applies them in this order):

* `normalise` (response and gold): full-width ASCII (``５``, ``（Ｂ）``, ``：``) to ASCII; digit
  groups joined across a space or thin space (``1\\,000``, ``1 000`` -> ``1000``); scientific
  notation to a power of ten (``1.5e3`` -> ``1.5\\times10^{3}``), so that the ``e`` after a
  number never reads as Euler's number.
* `brace_boxes` (response): braces for a braceless ``\\boxed5`` / ``\\boxed \\frac12`` (up to the
  next ``$``, ``\\]``, ``\\)``, line end or end), a closing brace for an unterminated ``\\boxed{5``
  whose tail is one line, and one trailing period dropped inside a box (``\\boxed{5.}``).
* `box_answer_sentence` (response without a box): the last "The answer is ..." / "答案是..."
  sentence's answer, boxed; None when that answer mixes words with math.

`towers_equal(a, b)` compares two integer power towers (``2^{2^{2^{2^2}}}``, ``2^{65536}``,
``4^{8}``) exactly: a value N >= 2 is r^E for exactly one r that is not a perfect power, so two
towers are equal iff their (r, E) are; E is an exact integer, the full value never computed.

What it does not: no comparison of anything but towers; a rewrite never makes two different
answers equal (it only changes how one written answer is read).

Invariant: every function returns in about linear time in its input (a tower's exponents
are evaluated only up to `_MAX_EXPONENT_BITS`); none raises on any str.
"""

import re

from sympy import integer_nthroot

# Full-width forms U+FF01..U+FF5E are ASCII 0x21..0x7E shifted; U+3000 is the ideographic space.
_FULL_WIDTH = {0xFF01 + i: 0x21 + i for i in range(94)} | {0x3000: " "}
# A digit group separator: space, no-break / thin / narrow no-break space, LaTeX \, \; \: \  ~ {,}
_SEP = r"(?:\\[,;: ]|~|\{,\}|[ \u00a0\u2009\u202f])"
# 1-3 digits, then groups of exactly three; never inside a longer number or a decimal part.
_GROUPED = re.compile(rf"(?<![\d.,])\d{{1,3}}(?:{_SEP}\d{{3}})+(?![\d])")
_SCI = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w]|\.\d)")
_BOXED = re.compile(r"\\boxed(?![A-Za-z])")
# End of a braceless \boxed argument: math delimiters, a line end.
_BRACELESS_END = re.compile(r"\$|\\\]|\\\)|\n")
_ANSWER_SENTENCE = re.compile(r"(?:[Tt]he (?:final )?answer is|(?:最终)?答案(?:是|为))\s*:?\s*")
# End of a sentence's answer: a full stop (ASCII before space or end, or 。), a line end.
_SENTENCE_END = re.compile(r"\.(?=\s|$)|。|\n")
# A word answer (names, days): compared as text, never as a formula (a text comparison of
# formulas would accept \\frac{12}{3} for \\frac{1}{23}).
WORDS = re.compile(r"[A-Za-z][A-Za-z' -]*")
# Two letters in a row that are not part of a command name, or any CJK character: prose.
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}|[\u3040-\u30ff\u4e00-\u9fff]")
_TEXT_GROUP = re.compile(r"\\(?:text|mathrm|mbox)\{[^{}]*\}")


def normalise(s: str) -> str:
    """Full-width to ASCII, grouped digits joined, scientific notation as a power of ten."""
    s = s.translate(_FULL_WIDTH)
    s = _GROUPED.sub(lambda m: re.sub(_SEP, "", m[0]), s)
    return _SCI.sub(lambda m: f"{m[1]}\\times10^{{{m[2]}}}", s)


def _close(text: str, start: int) -> int | None:
    """Index of the brace closing the one at `start`, or None if it never closes."""
    depth = 0
    for j in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j
    return None


def _drop_period(content: str) -> str:
    """One trailing period off a box's content (``5.`` -> ``5``), never an ellipsis."""
    c = content.rstrip()
    return c[:-1].rstrip() if c.endswith(".") and not c.endswith("..") else content


def brace_boxes(text: str) -> str:
    """Every ``\\boxed`` with a braced argument: braces added, unterminated tail closed."""
    out, i = [], 0
    for m in _BOXED.finditer(text):
        if m.start() < i:  # inside a box already rewritten
            continue
        out.append(text[i : m.start()])
        k = m.end()
        while k < len(text) and text[k] == " ":
            k += 1
        if k < len(text) and text[k] == "{":
            end = _close(text, k)
            if end is None:
                tail = text[k + 1 :]
                if "\n" in tail.strip():  # a long unterminated box: no telling where it ends
                    out.append(text[m.start() :])
                    return "".join(out)
                depth = 1 + tail.count("{") - tail.count("}")
                out.append("\\boxed{" + _drop_period(tail.rstrip()) + "}" * max(depth, 1))
                return "".join(out)
            out.append("\\boxed{" + _drop_period(text[k + 1 : end]) + "}")
            i = end + 1
            continue
        stop = _BRACELESS_END.search(text, k)
        end = stop.start() if stop else len(text)
        content = _drop_period(text[k:end].strip())
        out.append(f"\\boxed{{{content}}}" if content else text[m.start() : end])
        i = end
    out.append(text[i:])
    return "".join(out)


def _strip_math(s: str) -> str:
    for d in ("$", "\\(", "\\)", "\\[", "\\]"):
        s = s.replace(d, "")
    return s.strip()


def box_answer_sentence(text: str) -> str | None:
    """The text with its last answer sentence's answer boxed; the text itself if it has no
    such sentence (or an empty answer); None if the answer has words besides math."""
    matches = list(_ANSWER_SENTENCE.finditer(text))
    if not matches:
        return text
    start = search_from = matches[-1].end()
    if text.startswith("$", start) and "$" in text[start + 1 :]:
        # "$5$. I hope ...": the math ends the sentence (a period inside it does not); if more
        # follows the math ("$5$ or $6$"), the whole sentence is the answer.
        search_from = text.index("$", start + 1) + 1
        if re.match(r"\s*(?:\.|。|\n|$)", text[search_from:]):
            return _box(text, start, search_from)
    stop = _SENTENCE_END.search(text, search_from)
    return _box(text, start, stop.start() if stop else len(text))


def _box(text: str, start: int, end: int) -> str | None:
    """`text` with its answer ``text[start:end]`` boxed (see box_answer_sentence)."""
    answer = _strip_math(text[start:end]).rstrip(".")
    if not answer:
        return text
    if not WORDS.fullmatch(answer) and _PROSE_WORD.search(_TEXT_GROUP.sub("", answer)):
        return None
    return text[:start] + "\\boxed{" + answer + "}" + text[end:]


# Exponents are evaluated exactly up to this size; a tower needing more is undecided.
_MAX_EXPONENT_BITS = 1 << 20
_MAX_DIGITS = 200  # per integer literal
_DIGITS = re.compile(r"\d+")


class _Undecided(Exception):
    pass


def _parse_tower(s: str, i: int = 0) -> tuple[object, int]:
    """Tower grammar: atom ('^' (digit | '{' tower '}'))?; atom: digits | '{' tower '}' |
    '(' tower ')'. Returns (tree, next index); a tree is an int or (base, exponent)."""
    if i < len(s) and s[i] in "{(":
        base, j = _parse_tower(s, i + 1)
        if j >= len(s) or s[j] != "})"["{(".index(s[i])]:
            raise _Undecided
        j += 1
    else:
        m = _DIGITS.match(s, i)
        if not m or len(m[0]) > _MAX_DIGITS:
            raise _Undecided
        base, j = int(m[0]), m.end()
    if j < len(s) and s[j] == "^":
        if j + 1 < len(s) and s[j + 1] == "{":
            exp, k = _parse_tower(s, j + 2)
            if k >= len(s) or s[k] != "}":
                raise _Undecided
            return (base, exp), k + 1
        if j + 1 < len(s) and s[j + 1].isdigit():  # TeX: an unbraced exponent is one digit
            return (base, int(s[j + 1])), j + 2
        raise _Undecided
    return base, j


def _tower(s: str) -> object:
    s = re.sub(r"\s+|\\left|\\right", "", s.replace("$", ""))
    tree, end = _parse_tower(s)
    if end != len(s):
        raise _Undecided
    return tree


def _value(t: object) -> int:
    """Exact value of a tower used as an exponent (capped at _MAX_EXPONENT_BITS)."""
    if isinstance(t, int):
        return t
    b, e = _value(t[0]), _value(t[1])
    if b > 1 and e * b.bit_length() > _MAX_EXPONENT_BITS:
        raise _Undecided
    return b**e


def _root(n: int) -> tuple[int, int]:
    """n = r^m with r not a perfect power (n >= 2)."""
    for m in range(n.bit_length(), 1, -1):
        r, exact = integer_nthroot(n, m)
        if exact:
            return int(r), m
    return n, 1


def _canonical(t: object) -> tuple[int, int]:
    """(r, E) with value r^E and r >= 2 not a perfect power; (v, 0) for the values 0 and 1."""
    if isinstance(t, int):
        return (t, 0) if t < 2 else _root(t)
    r, m = _canonical(t[0])
    e = _value(t[1])
    if e == 0:
        return (1, 0)
    return (r, 0) if m == 0 else (r, m * e)


def towers_equal(a: str, b: str) -> bool | None:
    """Exact equality of two integer power towers (at least one with a ``^``); None when either
    is not one or an exponent is too large to evaluate."""
    if "^" not in a + b:
        return None
    try:
        return _canonical(_tower(a)) == _canonical(_tower(b))
    except (_Undecided, RecursionError):
        return None
