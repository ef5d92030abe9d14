"""The strict checker's rewrites of answer forms, and exact power towers."""

import pytest

from oreal_fast.judge.strict_forms import box_answer_sentence, brace_boxes, normalise, towers_equal


@pytest.mark.parametrize(
    "text,want",
    [
        (r"1\,000\,000", "1000000"),
        ("12 345.5", "12345.5"),
        ("1\u2009000", "1000"),
        ("2020 100", "2020 100"),  # a four-digit group is no thousands group
        ("0.123 456", "0.123 456"),  # nor digits after a decimal point
        ("1.5e3", r"1.5\times10^{3}"),
        ("1E-3.", r"1\times10^{-3}."),
        ("2e", "2e"),  # Euler's number stays
        ("2e^3", "2e^3"),
        ("x2e3", "x2e3"),
        ("3e-2x", "3e-2x"),
        ("（Ｂ）：５", "(B):5"),
        ("5²", "5²"),  # not NFKC: a superscript two is no digit 2
    ],
)
def test_normalise(text, want):
    assert normalise(text) == want


@pytest.mark.parametrize(
    "text,want",
    [
        (r"so \boxed5", r"so \boxed{5}"),
        (r"$\boxed \frac12$ done", r"$\boxed{\frac12}$ done"),
        (r"\boxed{5.}", r"\boxed{5}"),
        (r"\boxed{1, 2, 3, ...}", r"\boxed{1, 2, 3, ...}"),  # an ellipsis stays
        (r"\boxed{\frac{1}{2", r"\boxed{\frac{1}{2}}"),
        ("\\boxed{5\nand more lines", "\\boxed{5\nand more lines"),  # no telling where it ends
        (r"\boxed{3} and \boxed{\frac{1}{2}}", r"\boxed{3} and \boxed{\frac{1}{2}}"),
        (r"\boxedx", r"\boxedx"),
    ],
)
def test_brace_boxes(text, want):
    assert brace_boxes(text) == want


@pytest.mark.parametrize(
    "text,want",
    [
        ("So the answer is 3.5. Done.", r"So the answer is \boxed{3.5}. Done."),
        ("The answer is $x=2$. I hope it is correct.", r"The answer is \boxed{x=2}. I hope it is correct."),
        ("The answer is 10 \\text{ cm}.", "The answer is \\boxed{10 \\text{ cm}}."),
        ("The answer is Monday.", r"The answer is \boxed{Monday}."),
        ("The answer is 5, since 2 + 3 = 5.", None),
        ("答案是不是5。", None),
        ("最终答案为 5", r"最终答案为 \boxed{5}"),
        ("The answer is:\n$$5$$", "The answer is:\n\\boxed{5}"),  # display math on the next line
        ("The answer is .", "The answer is ."),  # empty: untouched
        ("no sentence, just 5", "no sentence, just 5"),
    ],
)
def test_box_answer_sentence(text, want):
    assert box_answer_sentence(text) == want


@pytest.mark.parametrize(
    "a,b,want",
    [
        ("2^{2^{2^{2^2}}}", "2^{65536}", True),
        ("65536", "2^{16}", True),
        ("8^{2}", "4^{3}", True),
        ("0^{7}", "0", True),
        ("1^{10^{100}}", "1", True),
        ("2^10", "1024", None),  # TeX reads 2^1 0: not a tower
        ("2^{-1}", "0.5", None),
        ("5", "6", None),  # no power: math-verify's case
        ("2^{2^{2^{2^{2^{2^2}}}}}", "2^{2^{2^{2^{2^{2^2}}}}}", None),  # exponent past the cap
    ],
)
def test_towers_equal(a, b, want):
    assert towers_equal(a, b) is want
