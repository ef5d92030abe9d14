"""Table of (response, gold) cases: the official verdict worked by hand from reference 10.4,
and the strict verdict. Rewards are those of a rule_only judger: +1 confirmed, -1 otherwise.

Each case says why in its id; ``E`` is the stop word the responses end with.
"""

import pytest

from oreal_fast.judge import rule_official, rule_strict
from oreal_fast.judge.router import prepare_text
from oreal_fast.judge.settings import parse_judger_settings

E = "<|im_end|>"
SETTINGS = parse_judger_settings("math_judger", {"rule_only": True})

# (id, response, gold, official reward, strict reward)
CASES = [
    # plain matches and the float branch
    ("boxed-int", r"so \boxed{42}" + E, "42", 1, 1),
    ("boxed-wrong-int", r"\boxed{41}" + E, "42", -1, -1),
    ("gold-times-100-accepted", r"\boxed{4200}" + E, "42", 1, -1),
    ("gold-over-100-accepted", r"\boxed{0.42}" + E, "42", 1, -1),
    ("float-rel-tol-1e-4", r"\boxed{42.003}" + E, "42", 1, -1),
    ("float-outside-tol", r"\boxed{42.01}" + E, "42", -1, -1),
    ("power-overflow-equal", r"\boxed{2^{2020}}" + E, "2^{2019}", 1, -1),
    ("power-exact", r"\boxed{2^{10}}" + E, "1024", 1, 1),
    ("comma-thousands", r"\boxed{1,000}" + E, "1000", 1, 1),
    ("comma-list-read-as-number", r"\boxed{3,5}" + E, "35", 1, -1),
    ("trailing-zeros", r"\boxed{12.000}" + E, "12", 1, 1),
    ("leading-dot", r"\boxed{.5}" + E, "0.5", 1, 1),
    # fractions vs decimals, symbolic branch
    ("frac-vs-decimal", r"\boxed{\frac{1}{2}}" + E, "0.5", 1, 1),
    ("decimal-vs-frac", r"\boxed{0.5}" + E, r"\frac{1}{2}", 1, 1),
    ("dfrac", r"\boxed{\dfrac{3}{4}}" + E, r"\frac{3}{4}", 1, 1),
    ("slash-to-frac", r"\boxed{3/4}" + E, r"\frac34", 1, 1),
    ("slash-symbolic", r"\boxed{1/2}" + E, "0.5", 1, 1),
    ("frac-shorthand", r"\boxed{\frac12}" + E, r"\frac{1}{2}", 1, 1),
    ("negative-frac", r"\boxed{-\frac{1}{2}}" + E, "-0.5", 1, 1),
    ("sqrt-shorthand", r"\boxed{\sqrt2}" + E, r"\sqrt{2}", 1, 1),
    ("sqrt-simplify", r"\boxed{\sqrt{8}}" + E, r"2\sqrt{2}", 1, 1),
    ("nested-braces", r"\boxed{\frac{\sqrt{3}}{2}}" + E, r"\frac{\sqrt{3}}{2}", 1, 1),
    ("polynomial-expanded", r"\boxed{x^2+2x+1}" + E, "(x+1)^2", 1, 1),
    ("pi-is-a-symbol-for-parse-latex", r"\boxed{\pi}" + E, "3.14159", -1, -1),
    ("sqrt-numeric-1e-3", r"\boxed{\sqrt{2}}" + E, "1.414", 1, -1),
    ("sqrt2-numeric-1e-3", r"\boxed{1.4142}" + E, r"\sqrt{2}", 1, -1),
    ("third-numeric-1e-3", r"\boxed{\frac{1}{3}}" + E, "0.3333", 1, -1),
    ("j-read-as-i", r"\boxed{3+4j}" + E, "3+4i", 1, -1),
    # percentages, units, degrees, currency
    ("percent-vs-number", r"\boxed{50\%}" + E, "50", 1, 1),
    ("percent-gold-rejects", r"\boxed{50\%}" + E, r"50\%", -1, 1),
    ("percent-gold-vs-fraction", r"\boxed{0.5}" + E, r"50\%", -1, 1),
    ("percent-gold-vs-other-number", r"\boxed{0.4}" + E, r"50\%", -1, -1),
    ("degree-vs-number", r"\boxed{90^\circ}" + E, "90", 1, 1),
    ("degree-gold-rejects", r"\boxed{30^\circ}" + E, r"30^\circ", -1, 1),
    ("dollar-vs-number", r"\boxed{\$5}" + E, "5", 1, 1),
    ("dollar-gold-rejects", r"\boxed{\$18.90}" + E, r"\$18.90", -1, 1),
    ("unit-text-tail", r"\boxed{10 \text{ cm}}" + E, "10", 1, 1),
    ("unit-not-at-end", r"\boxed{10\text{ cm}^2}" + E, "10", -1, 1),
    ("radians-vs-degrees", r"\boxed{\frac{\pi}{2}}" + E, r"90^\circ", -1, -1),
    # intervals, tuples, sets, matrices
    ("tuple-equal", r"\boxed{(1,2)}" + E, "(1,2)", 1, 1),
    ("tuple-spaces", r"\boxed{(1, 2)}" + E, "(1,2)", 1, 1),
    ("tuple-left-right", r"\boxed{\left(1,2\right)}" + E, "(1,2)", 1, 1),
    ("tuple-swapped", r"\boxed{(2,1)}" + E, "(1,2)", -1, -1),
    ("tuple-length", r"\boxed{(1,2,3)}" + E, "(1,2)", -1, -1),
    ("list-componentwise", r"\boxed{[1,2]}" + E, "[1, 2]", 1, 1),
    ("interval-half-open", r"\boxed{[1,3)}" + E, "[1,3)", 1, 1),
    ("interval-closed-vs-half-open", r"\boxed{[1,3]}" + E, "[1,3)", 1, -1),
    ("interval-open-vs-closed", r"\boxed{(1,3)}" + E, "[1,3]", -1, -1),
    ("x-in-deleted", r"\boxed{x\in[1,3)}" + E, "[1,3)", 1, 1),
    ("x-space-in-kept", r"\boxed{x \in [1,3)}" + E, "[1,3)", -1, 1),
    ("unordered-list", r"\boxed{3, 5}" + E, "5, 3", -1, 1),
    ("pmatrix-rejected", r"\boxed{\begin{pmatrix}1\\2\end{pmatrix}}" + E,
     r"\begin{pmatrix}1\\2\end{pmatrix}", -1, 1),
    ("infinity", r"\boxed{\infty}" + E, r"\infty", 1, 1),
    ("infinity-word", r"\boxed{infinity}" + E, r"\infty", 1, 1),
    # equations, options, words
    ("short-lhs-dropped", r"\boxed{y=2x+1}" + E, "2x+1", 1, 1),
    ("long-lhs-kept", r"\boxed{x+y=5}" + E, "5", -1, 1),
    ("option-text-wrapper", r"\boxed{\text{(B)}}" + E, "B", 1, 1),
    ("option-paren-gold", r"\boxed{B}" + E, "(B)", 1, 1),
    ("word-in-text-wrapper", r"\boxed{\text{Evelyn}}" + E, "Evelyn", 1, 1),
    ("word-case-differs", r"\boxed{monday}" + E, r"\text{Monday}", -1, 1),
    ("word-differs", r"\boxed{Tuesday}" + E, "Monday", -1, -1),
    ("brace-deletion-false-accept", r"\boxed{\frac{12}{3}}" + E, r"\frac{1}{23}", 1, -1),
    ("decimal-point-matters", r"\boxed{05}" + E, "0.5", -1, -1),
    ("and-deleted-from-word", r"\boxed{Sandy}" + E, "Sandy", -1, 1),
    ("and-deleted-joins-numbers", r"\boxed{2 and 3}" + E, "23", 1, -1),
    # extraction: which answer is read
    ("answer-is-sentence", "The answer is $5$. I hope it is correct." + E, "5", -1, 1),
    ("final-answer-is", "The final answer is 5." + E, "5", 1, 1),
    ("answer-is-colon", "The answer is: 7" + E, "7", 1, 1),
    ("boxed-beats-answer-is", r"The answer is \boxed{7}." + E, "7", 1, 1),
    ("last-boxed-wins-over-hedge", r"\boxed{3} then \boxed{5}" + E, "5", 1, -1),
    ("boxed-parts-form-the-answer", r"\boxed{3} and \boxed{5}" + E, "3, 5", -1, 1),
    ("earlier-boxed-ignored", r"\boxed{3} then \boxed{5}" + E, "3", -1, -1),
    ("boxed-without-brace", r"so $\boxed 5$" + E, "5", 1, 1),
    ("boxed-word-in-prose", "The numbers I boxed are gone. The final answer is 9" + E, "9", -1, 1),
    ("fbox-falls-to-last-number", r"\fbox{5}" + E, "5", 1, 1),
    ("last-number", "so we get 12 apples and 15 pears" + E, "15", 1, 1),
    ("last-number-with-comma", "the total is 1,000" + E, "1000", 1, 1),
    ("empty-box", r"\boxed{}" + E, "5", -1, -1),
    ("no-answer", "I do not know." + E, "5", -1, -1),
    ("unterminated-box", r"\boxed{\frac{1}{2}" + E, r"\frac{1}{2}", 1, 1),
    # right-answer forms, each with a wrong variant. Official: strip_string deletes spaces but
    # not "\,", which parse_latex skips; float() reads "1.5e3" and full-width digits; a
    # braceless box reads to the first "$"; an unterminated one to the end; "(B)" loses its
    # parentheses; the Chinese sentence falls to the last number; both towers overflow to inf.
    ("thin-space-thousands", r"\boxed{1\,000}" + E, "1000", 1, 1),
    ("thin-space-thousands-wrong", r"\boxed{1\,500}" + E, "1000", -1, -1),
    ("space-thousands", r"\boxed{1 000}" + E, "1000", 1, 1),
    ("space-thousands-wrong", r"\boxed{1 500}" + E, "1000", -1, -1),
    ("scientific-notation", r"\boxed{1.5e3}" + E, "1500", 1, 1),
    ("scientific-notation-wrong", r"\boxed{1.5e3}" + E, "1501", -1, -1),
    ("scientific-negative-exponent", r"\boxed{1e-3}" + E, "0.001", 1, 1),
    ("scientific-negative-exponent-wrong", r"\boxed{1e-3}" + E, "0.002", -1, -1),
    ("e-after-number-read-as-symbol-e", r"\boxed{1e-3}" + E, "e-3", 1, -1),  # parse_latex: 1*e - 3
    ("box-trailing-period", r"\boxed{5.}" + E, "5", 1, 1),
    ("box-trailing-period-wrong", r"\boxed{6.}" + E, "5", -1, -1),
    ("braceless-box-digit", r"so \boxed5" + E, "5", 1, 1),
    ("braceless-box-digit-wrong", r"so \boxed6" + E, "5", -1, -1),
    ("braceless-box-frac", r"so \boxed \frac12" + E, r"\frac{1}{2}", 1, 1),
    ("braceless-box-frac-wrong", r"so \boxed \frac13" + E, r"\frac{1}{2}", -1, -1),
    ("braceless-box-reads-to-the-dollar", r"so $\boxed 2\sqrt{3}$" + E, r"2\sqrt{3}", 1, 1),
    ("braceless-box-not-just-its-first-number", r"so $\boxed 2\sqrt{3}$" + E, "2", -1, -1),
    ("unterminated-box-at-end", r"so \boxed{5" + E, "5", 1, 1),
    ("unterminated-box-at-end-wrong", r"so \boxed{6" + E, "5", -1, -1),
    ("answer-is-option", "The answer is (B)." + E, "B", 1, 1),
    ("answer-is-option-wrong", "The answer is (C)." + E, "B", -1, -1),
    ("answer-is-colon-no-space", "The answer is:5." + E, "5", 1, 1),
    ("answer-is-colon-no-space-wrong", "The answer is:6." + E, "5", -1, -1),
    ("answer-is-negated", "The answer is not 5." + E, "5", -1, -1),
    ("answer-is-hedged", "The answer is $5$ or $6$." + E, "5", -1, -1),
    ("chinese-answer-sentence", "答案是5。" + E, "5", 1, 1),
    ("chinese-answer-sentence-wrong", "答案是6。" + E, "5", -1, -1),
    ("full-width-digit", "\\boxed{５}" + E, "5", 1, 1),
    ("full-width-digit-wrong", "\\boxed{６}" + E, "5", -1, -1),
    ("power-tower-equal", r"\boxed{2^{2^{2^{2^2}}}}" + E, "2^{65536}", 1, 1),
    ("power-tower-off-by-one", r"\boxed{2^{2^{2^{2^2}}}}" + E, "2^{65537}", 1, -1),
    # a number answered with the calculation that gives it: official's symbolic branch parses the
    # product and finds it equal; strict wants the value (a model learns to copy the question)
    ("calculation-for-number-product", r"so \boxed{64942 \times 63126}" + E, "4099528692", 1, -1),
    ("calculation-for-number-difference", r"\boxed{7640 - 5702}" + E, "1938", 1, -1),
    # thinking-finish words
    ("after-last-think", r"<think>maybe \boxed{3}</think> so \boxed{5}" + E, "5", 1, 1),
    ("think-cut-drops-box", r"\boxed{5} </think> no box here, answer 3" + E, "5", -1, -1),
    ("conclude-then-final-answer", r"<conclude> \boxed{5} **Final Answer** \boxed{6}" + E, "6", 1, 1),
    ("final-answer-cut-hides-earlier", r"<conclude> \boxed{5} **Final Answer** \boxed{6}" + E, "5", -1, -1),
    ("think-after-final-answer", r"**Final Answer** \boxed{6} </think> 5" + E, "5", 1, 1),
    # stop word
    ("missing-stop-word", r"\boxed{5}", "5", -1, -1),
    ("endoftext-not-stop-word", r"\boxed{5}<|endoftext|>", "5", -1, -1),
    ("endoftext-after-stop-word", r"\boxed{5}" + E + "<|endoftext|>", "5", -1, -1),
    ("whitespace-after-stop-word", r"\boxed{5}" + E + "\n  ", "5", 1, 1),
    ("stop-word-inside-removed", r"\boxed{5" + E + "}" + E, "5", 1, 1),
]


def _reward(mode_check, response: str, gold: str) -> int:
    text = prepare_text(response, SETTINGS)
    return -1 if text is None else (1 if mode_check(text, gold) else -1)


def test_table_is_large_and_ids_unique():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


def test_latex_parser_loads():
    # The official verdicts below assume sympy's parse_latex works (antlr4 runtime 4.11.*);
    # without it every LaTeX parse silently falls back to parse_expr and verdicts change.
    assert rule_official.latex_parser_available(), "install antlr4-python3-runtime==4.11.*"


@pytest.mark.parametrize("response,gold,official", [c[1:4] for c in CASES], ids=[c[0] for c in CASES])
def test_official_verdict(response, gold, official):
    assert _reward(rule_official.check, response, gold) == official


@pytest.mark.parametrize("response,gold,strict", [(c[1], c[2], c[4]) for c in CASES], ids=[c[0] for c in CASES])
def test_strict_verdict(response, gold, strict):
    assert _reward(rule_strict.check, response, gold) == strict


@pytest.mark.parametrize(
    "response,gold,strict",
    [
        (r"\boxed{-321 \cdot 87 + (-988)/1}" + E, "-28915", -1),
        (r"\boxed{64942 * 63126}" + E, "4099528692", -1),
        (r"\boxed{12 \div 4}" + E, "3", -1),
        ("So the total is 3 + 4." + E, "7", -1),  # no box: math-verify's extracted answer is checked
        (r"\boxed{5 + 3 = 8}" + E, "8", 1),  # the working, then the value
        (r"\boxed{4099528692}" + E, "4099528692", 1),
        (r"\boxed{-5}" + E, "-5", 1),
        (r"\boxed{1.5 \times 10^{3}}" + E, "1500", 1),  # scientific notation is a value
        (r"\boxed{2^{10}}" + E, "1024", 1),
        (r"\boxed{\frac{6}{4}}" + E, "1.5", 1),
        (r"\boxed{( 69 / 3 )}" + E, "23", -1),  # an integer gold: a fraction is the division asked for
        (r"\boxed{\frac{46}{2}}" + E, "23", -1),
        (r"\boxed{1+\sqrt{2}}" + E, r"1+\sqrt{2}", 1),  # the gold is itself an expression
    ],
    ids=["mixed-operations", "ascii-star", "div-sign", "unboxed-sum", "working-then-value", "value", "negative",
         "scientific", "power", "fraction", "integer-as-division", "integer-as-frac", "expression-gold"],
)
def test_strict_wants_a_number_not_a_calculation(response, gold, strict):
    assert _reward(rule_strict.check, response, gold) == strict


@pytest.mark.parametrize(
    "response,gold,strict",
    [
        # 2^(2^65536) has more digits than atoms in the universe: only r^E compares it
        (r"\boxed{2^{2^{2^{2^{2^2}}}}}" + E, r"4^{2^{65535}}", 1),
        (r"\boxed{2^{2^{2^{2^{2^2}}}}}" + E, r"2^{2^{65535}}", -1),
        (r"\boxed{(2^{3})^{2}}" + E, "64", 1),
        (r"\boxed{4^{8}}" + E, "2^{15}", -1),
        (r"\boxed{10^{10^{10}}}" + E, "5", -1),  # decided at once, where sympy takes hours
    ],
    ids=["tower-beyond-floats", "tower-beyond-floats-wrong", "tower-parenthesised", "tower-other-base",
         "tower-vs-small"],
)
def test_strict_power_towers_compare_exactly(response, gold, strict):
    # Official mode is left out: it spins for hours on some of these (hence the worker limit).
    assert _reward(rule_strict.check, response, gold) == strict
