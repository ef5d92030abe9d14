"""The official OREAL rule checker, reproduced verdict for verdict (reference section 10.4).

What it does: `check(text, gold)` extracts an answer from a post-processed response and
compares it to the gold answer exactly as the official trainer's rule verifier does,
including its known mistakes (they are part of the reward contract):

* the answer is taken after the last substring ``boxed`` (the official pattern was meant to
  be ``\\boxed`` but is a non-raw string, so it splits on plain ``boxed``);
* a numeric answer equal to gold, gold*100 or gold/100 (rel. tol. 1e-4) is accepted, so
  4200 and 0.42 pass for 42, and two numbers never reach the symbolic check;
* normalisation deletes the letters "and" everywhere, ``\\text{`` tails, ``$``, ``%`` and
  ``^\\circ`` only from the prediction, never from the gold, so ``30^\\circ`` / ``50\\%`` /
  ``\\$18.90`` style golds reject even a correct answer;
* the symbolic check parses with sympy's ``parse_latex`` (needs the antlr4 runtime that
  sympy's generated parser was built with, 4.11) and falls back to ``parse_expr``.

What it does not: it has no time limit of its own (sympy can hang); callers run it in a
worker process that can be killed (see pool.py).

One deliberate difference: the official code evaluates unparsed answer strings with sympy's
``parse_expr``/``sympify``, which run Python ``eval`` with builtins such as ``exec`` and
``open`` in scope, i.e. a model's answer could run code. We parse with the same
transformations but a namespace without those builtins and refuse dunder names; this only
changes the verdict for strings that call them, which never equal a math answer.

Invariant: `check` returns True only when the official checker would; it never raises.
"""

import builtins
import math
import re
import types

import sympy
from sympy.parsing.latex import parse_latex
from sympy.parsing.sympy_parser import (
    convert_xor,
    parse_expr,
    rationalize,
    standard_transformations,
)

# Split pattern of the effective official extract_answer: "\b" there is a backspace char.
_BOXED_SPLIT = re.compile("\x08oxed|boxed")
_ANSWER_IS = re.compile("[Tt]he (final )?answer is:?")
_NUMBER = re.compile(r"-?\d*\.?\d+")

# Names an answer string must never reach through eval: code runners, and everything that
# makes a str that sympy would then eval with its default (unsafe) namespace. The rest keep
# the official results, e.g. abs(-3) still parses to 3.
_UNSAFE_NAMES = {
    "__import__", "__build_class__", "breakpoint", "compile", "delattr", "dir", "eval",
    "exec", "getattr", "globals", "hasattr", "input", "locals", "open", "print", "setattr",
    "vars", "aiter", "anext", "iter", "next", "help", "chr", "ascii", "format", "repr",
    "bin", "hex", "oct", "sympify", "S", "parse_expr", "lambdify", "srepr", "var", "symbols",
}
# String literals (sympy sympifies them with its default namespace), dunders and attribute
# access are the ways out of a restricted eval; no math answer needs them.
_UNSAFE_SYNTAX = re.compile(r"[\'\"]|__|[A-Za-z_)\]}]\s*\.\s*[A-Za-z_]")


def _safe_namespace() -> dict:
    """The namespace sympy's parse_expr builds by default, minus the names above."""
    ns: dict = {}
    exec("from sympy import *", ns)  # noqa: S102 - a constant import, as sympy itself does
    for name, obj in vars(builtins).items():
        if isinstance(obj, types.BuiltinFunctionType):
            ns[name] = obj
    ns["max"], ns["min"] = sympy.Max, sympy.Min
    for name in _UNSAFE_NAMES:
        ns.pop(name, None)
    ns["__builtins__"] = {}
    return ns


_NAMESPACE = _safe_namespace()


def _parse_expr(s: str, transformations: tuple) -> sympy.Basic:
    if _UNSAFE_SYNTAX.search(s):
        raise ValueError("not parsed: string literal, dunder or attribute access")
    return parse_expr(s, global_dict=dict(_NAMESPACE), transformations=transformations)


def _sympify_str(s: str) -> sympy.Basic:
    """sympy.N(str) path: sympify(s, rational=True) = parse_expr with two more rules."""
    return _parse_expr(s.replace("\n", ""), standard_transformations + (rationalize, convert_xor))


def _numeric(x: object) -> sympy.Basic:
    """sympy.N(x) with strings parsed through the safe namespace."""
    if isinstance(x, str):
        x = _sympify_str(x)
    return sympy.N(x)


def latex_parser_available() -> bool:
    """True when sympy's parse_latex loads (antlr4 runtime of the version sympy expects)."""
    try:
        parse_latex("1")
    except Exception:  # ImportError, or antlr raising on a version mismatch
        return False
    return True


def _braced_content(s: str) -> str:
    """Content after an opening brace up to its matching close (unterminated: to the end)."""
    depth, out = 1, []
    for c in s[1:]:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        out.append(c)
    return "".join(out)


def extract_answer(text: str) -> str:
    """The answer string the official checker compares (reference 10.4, extract_answer)."""
    if _BOXED_SPLIT.search(text):
        tail = _BOXED_SPLIT.split(text)[-1]
        if not tail:
            return ""
        a = _braced_content(tail) if tail[0] == "{" else tail.split("$")[0].strip()
    elif _ANSWER_IS.search(text):
        a = _ANSWER_IS.split(text)[-1].strip().rstrip(".")
    else:
        numbers = _NUMBER.findall(text.replace(",", ""))
        a = numbers[-1] if numbers else ""
    a = a.split("\n")[0]
    if a[:1] == ":":
        a = a[1:]
    if a[-1:] == ".":
        a = a[:-1]
    if a[-1:] == "/":
        a = a[:-1]
    return strip_string(a)


def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for p in parts[1:]:
        out += "\\frac"
        if p[:1] == "{":
            out += p
        elif len(p) < 2:
            return s  # the official gives up and returns its input unchanged
        elif p[1] != "{":
            out += "{" + p[0] + "}{" + p[1] + "}" + p[2:]
        else:
            out += "{" + p[0] + "}" + p[1:]
    return out


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    a, b = parts
    try:
        # int() as the official: accepts "+3", " 3", "1_0"; the round trip then rejects those.
        a = a if "sqrt" in a else int(a)
        b = b if "sqrt" in b else int(b)
    except ValueError:
        return s
    if s != f"{a}/{b}":
        return s
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def strip_string(s: str) -> str:
    """The official normalisation, every step in its order (reference 10.4, strip_string)."""
    s = str(s).strip().replace("\n", "").rstrip(".")
    s = s.replace("\\!", "").replace("\\ ", "")
    s = s.replace("\\\\", "\\").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    unitless = re.sub(r"\\text{.*?}$", "", s).strip()
    if unitless != "" and unitless != s:
        s = unitless
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\text", "").replace("x\\in", "")
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.replace("\\cdot", "")
    s = s.replace("infinity", "\\infty")
    if "\\infty" not in s:
        s = s.replace("inf", "\\infty")
    s = s.replace("+\\inity", "\\infty")
    s = s.replace("and", "").replace("\\mathbf", "")
    s = re.sub(r"\\mbox{.*?}", "", s)
    if "j" in s and "i" not in s:
        s = s.replace("j", "i")
    s = re.sub(r"(\d+)\.0+([^\d])", r"\1\2", s)
    s = re.sub(r"(\d+)\.0+$", r"\1", s)
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    return _fix_a_slash_b(s)


def _as_float(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def _parse(s: str) -> object:
    """parse_latex, else parse_expr, else the string itself (the official order)."""
    try:
        return parse_latex(s)
    except Exception:
        pass
    try:
        return _parse_expr(s, standard_transformations)
    except Exception:
        return s


def symbolic_equal(a: str, b: str) -> bool:
    """simplify(a - b) == 0, else N(a) close to N(b) at rel. tol. 1e-3; errors are False."""
    x, y = _parse(a), _parse(b)
    try:
        if sympy.simplify(x - y) == 0:
            return True
    except Exception:
        pass
    try:
        return math.isclose(_numeric(x), _numeric(y), rel_tol=1e-3)
    except Exception:
        return False


def _is_wrapped(s: str, left: str, right: str) -> bool:
    return s.startswith(left) and s.endswith(right)


def math_equal(pred: str, gold: str) -> bool:
    """The official comparison (reference 10.4, math_equal), percentage leniency on."""
    p, g = _as_float(pred), _as_float(gold)
    if p is not None and g is not None:
        return any(math.isclose(t, p, rel_tol=1e-4) for t in (g / 100, g, g * 100))
    if not pred:
        return False
    pred, gold = pred.strip(), gold.strip()
    ps, gs = pred, gold
    if (_is_wrapped(pred, "[", "]") and not gold.startswith("(")) or (
        _is_wrapped(pred, "(", ")") and not gold.startswith("[")
    ):
        ps, gs = ps.strip("[]()"), gs.strip("[]()")
    for c in "{}()":
        ps, gs = ps.replace(c, ""), gs.replace(c, "")
    if ps == gs:
        return True
    if (_is_wrapped(pred, "[", "]") and _is_wrapped(gold, "[", "]")) or (
        _is_wrapped(pred, "(", ")") and _is_wrapped(gold, "(", ")")
    ):
        pp, gp = pred[1:-1].split(","), gold[1:-1].split(",")
        if len(pp) == len(gp) and all(math_equal(a, b) for a, b in zip(pp, gp)):
            return True
    return symbolic_equal(pred, gold)


def check(text: str, gold: str) -> bool:
    """True iff the official rule checker confirms `text` (post-processed) against `gold`."""
    try:
        return math_equal(extract_answer(text), str(gold))
    except Exception:  # RecursionError and friends: the official's caller counted them as no
        return False
