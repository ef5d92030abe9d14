"""The verifier reply parse: official A/B rule, and the CORRECT/INCORRECT switch."""

import pytest

from oreal_fast.judge.verifier import parse_grade


@pytest.mark.parametrize(
    "reply,official,switched",
    [
        ("A", True, True),
        ("B", False, False),
        ("A: CORRECT", True, True),
        ("B: INCORRECT", False, False),
        ("CORRECT", None, True),  # official: neither letter -> no grade
        ("INCORRECT", None, False),
        ("correct.", None, True),
        ("AB", None, None),
        ("", None, None),
        ("I cannot say.", None, None),
        ("Answer: INCORRECT", True, False),  # official reads the capital A of "Answer"
        ("a", None, None),  # the official letters are case-sensitive
    ],
)
def test_parse_grade(reply, official, switched):
    assert parse_grade(reply, accept_correct_incorrect=False) is official
    assert parse_grade(reply, accept_correct_incorrect=True) is switched
