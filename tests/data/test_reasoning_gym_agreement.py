"""scripts/reasoning_gym_agreement.py: the candidate answers it makes, and a tiny run of the whole table."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "reasoning_gym_agreement.py")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("reasoning_gym_agreement", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fraction_candidates(script):
    got = [tuple(c) for c in script.candidates("3/4", "Simplify the fraction 15/20.")]
    assert got == [
        ("as written", "3/4", True), ("\\frac{a}{b}", "\\frac{3}{4}", True), ("a / b with spaces", "3 / 4", True),
        ("not in lowest terms", "6/8", True), ("decimal", "0.75", True), ("reciprocal", "4/3", False),
        ("numerator off by one", "4/4", False), ("sign flipped", "-3/4", False),
    ]
    latex = [tuple(c) for c in script.candidates("\\dfrac{1}{3}", "Simplify $\\dfrac{5}{15}$.")]
    assert latex[1] == ("a/b", "1/3", True)
    assert ("decimal, 6 significant figures", "0.333333", False) in latex


def test_the_questions_expression_is_a_candidate_of_its_exact_value(script):
    question = "Calculate -373 + -347 - ( ( -( -795 + 970 ) ) * -152 )."
    # -373 - 347 = -720; -(175) * -152 = 26600, and -720 - 26600 = -27320
    assert script.candidates("-27320", question)[-1] == (
        "the question's expression", "-373 + -347 - ( ( -( -795 + 970 ) ) * -152 )", True)
    assert script.candidates("-27321", question)[-1][2] is False
    assert script.question_expression("State the final answer to the following arithmetic problem: 7 / 2 - 1 =")[1] \
        == script.Fraction(5, 2)
    assert script.question_expression("Ava walks 25 miles, 15 of them on the beach.") is None


def test_integer_candidates_of_an_equation(script):
    got = [tuple(c) for c in script.candidates("-1234", "Solve for e: 2*e = -2468")]
    assert got == [
        ("as written", "-1234", True), ("trailing zero", "-1234.0", True), ("thousands separators", "-1,234", True),
        ("equation form", "e = -1234", True), ("off by one", "-1233", False), ("x100", "-123400", False),
        ("/100", "-12.34", False), ("0.001 % off", "-1234.01234", False), ("sign flipped", "1234", False),
    ]


def test_a_candidate_that_keeps_the_value_says_so_and_none_repeats_the_gold(script):
    zero = {c.kind for c in script.candidates("0", "Solve the following multiplication: 0 * 41.")}
    # x100, /100, 0.001 % off, sign: all "0"
    assert zero == {"as written", "trailing zero", "off by one", "the question's expression"}
    rounded = {c.kind: c for c in script.candidates("1.50", "State the final answer: 0.75 + 0.75 =")}
    assert rounded["3 significant figures"] == ("3 significant figures", "1.5", True)
    assert rounded["e-notation, 3 significant figures"] == ("e-notation, 3 significant figures", "1.50e+00", True)


def test_decimal_and_complex_candidates(script):
    decimal = {c.kind: c.answer for c in script.candidates("-0.0013674811612376526", "Compute x^-1.")}
    assert decimal["3 significant figures"] == "-0.00137"
    assert decimal["e-notation, 3 significant figures"] == "-1.37e-03"
    assert "trailing zero" in decimal and "thousands separators" not in decimal
    assert "trailing zero" not in {c.kind for c in script.candidates("9.36e-18", "Compute x^8.")}
    complex_number = [tuple(c) for c in script.candidates("-15.0 + 3.0i", "Add (-8.0 - 2.0i) + (-7.0 + 5.0i)")]
    assert complex_number[1:] == [
        ("no spaces", "-15.0+3.0i", True), ("without .0", "-15 + 3i", True), ("j for i", "-15.0 + 3.0j", True),
        ("conjugate", "-15.0 - 3.0i", False), ("real part off by one", "-14 + 3.0i", False),
    ]
    assert [tuple(c) for c in script.candidates("x + 1", "?")] == [("as written", "x + 1", True)]


def test_a_tiny_run_counts_every_sample_once_and_agrees_on_the_gold(tmp_path):
    out = tmp_path / "agreement.json"
    env = {**os.environ, "PYTHONPATH": REPO}
    run = subprocess.run([sys.executable, SCRIPT, "--problems", "2", "--tasks", "gcd,complex_arithmetic",
                          "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [r["task"] for r in report["rows"]] == ["gcd", "complex_arithmetic"]
    for row in report["rows"]:
        for mode in ("official", "strict"):
            counts = row[mode]
            assert counts["agree"] + counts["ours_accept_task_rejects"] + counts["ours_reject_task_accepts"] == \
                row["samples"]
    assert all(e["kind"] != "as written" for e in report["examples"])  # both judges accept every gold
    # gcd's checker is an exact string match; the official rule also accepts gold x 100 (percentages)
    assert "| gcd | official | ours accept, task rejects | x100 | no | 2 |" in run.stdout
