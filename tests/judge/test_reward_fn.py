"""reward_fn through the real judge pool: known rewards in module and file form, each kind of failure
counted, scored -1 and logged once, and the start-up checks' one-line errors."""

import logging
import math
import textwrap

import pytest

from oreal_fast.judge import JudgeItem, Router
from oreal_fast.judge.reward_fn import check_reward_fn, reward_of

E = "<|im_end|>"
MAPPING = {"math": ["math_judger"]}
LIMIT_S = 0.3  # CPU seconds per call: the busy loop ends quickly


def _router(reward_fn: str) -> Router:
    judgers = {"math_judger": {"rule_only": True, "num_processes": 2, "rule_timeout_s": LIMIT_S}}
    return Router(judgers, MAPPING, reward_fn=reward_fn)


def _item(question: str, response: str = "r" + E, gold: str = "1", **record) -> JudgeItem:
    full = {"question": question, "gold_answer": gold, "data_source": "math", **record}
    return JudgeItem(question, response, gold, record=full)


@pytest.fixture(scope="module")
def moody():
    """A router whose reward_fn does what each sample's question says (reward_fns.by_question)."""
    with _router("reward_fns:by_question") as r:
        yield r


def test_module_form_gives_the_functions_rewards_with_the_whole_record():
    items = [_item("q", "ab 42" + E, "42", weight=0.5), _item("q", "no" + E, "42", weight=0.5),
             _item("q", "42", "42", weight=-2.0)]
    with _router("reward_fns:weighted_match") as r:
        out = r.judge(items)
    # 0.5 * 15 characters (the stop word is part of the text); False -> -1; -2 * 2 = -4 as is
    assert out.rewards == [7.5, -1.0, -4.0]
    assert out.counters["reward_fn_errors"] == out.counters["reward_fn_bad_returns"] == 0
    assert out.counters["rule_confirmed"] == out.counters["no_stop_word"] == 0  # the judger did not run


def test_file_form_loads_by_path_in_the_workers_from_a_relative_path(tmp_path, monkeypatch):
    """The file is on no import path, and the workers run in another folder than the one the path
    was given in (the fork server keeps the folder it started in): the router hands them the
    absolute path."""
    (tmp_path / "my_reward.py").write_text(textwrap.dedent("""
        import dataclasses

        @dataclasses.dataclass
        class Scale:
            factor: float

        def score(record, response, gold):
            return Scale(3.0).factor * response.count(gold) - record["pass_rate"]
    """))
    (tmp_path / "elsewhere").mkdir()
    items = [_item("q", "7 and 7" + E, "7", pass_rate=0.25), _item("q", "8" + E, "7", pass_rate=0.5)]
    monkeypatch.chdir(tmp_path)
    with _router("my_reward.py:score") as r:
        monkeypatch.chdir(tmp_path / "elsewhere")
        assert r.judge(items).rewards == [5.75, -0.5]


def test_a_module_that_maps_more_than_the_workers_memory_cap_loads(tmp_path):
    """Workers cap their address space at what they map after start-up + 4 GiB; a reward_fn's module
    is imported before the cap, as a module that loads large libraries (torch with CUDA) needs."""
    (tmp_path / "big.py").write_text(textwrap.dedent("""
        import mmap

        RESERVED = mmap.mmap(-1, 5 << 30)  # 5 GiB of address space, never touched

        def score(record, response, gold):
            return float(len(RESERVED) >> 30)
    """))
    with _router(f"{tmp_path}/big.py:score") as r:
        assert r.judge([_item("q")]).rewards == [5.0]


def test_shipped_example_scores_exact_match_less_a_length_penalty():
    ok = r"so \boxed{ 42 }" + E
    long_ok = "x" * (3000 - len(ok)) + ok  # 3000 characters: 1 - 0.5 * (3000 / 2000 - 1)
    items = [_item("q", ok, "42"), _item("q", long_ok, "42"), _item("q", "x" * 9000 + ok, "42"),
             _item("q", r"\boxed{41}" + E, "42"), _item("q", r"so \boxed{42}", "42")]
    with _router("oreal_fast.judge.example_rewards:length_penalised_exact_match") as r:
        assert r.judge(items).rewards == [1.0, 0.75, 0.5, -1.0, -1.0]


@pytest.mark.parametrize("kind, counter", [
    ("raise", "reward_fn_errors"), ("hang", "reward_fn_timeouts"), ("str", "reward_fn_bad_returns"),
    ("none", "reward_fn_bad_returns"), ("nan", "reward_fn_bad_returns"), ("inf", "reward_fn_bad_returns"),
    ("list", "reward_fn_bad_returns"),
])
def test_a_failed_call_scores_minus_one_is_counted_and_the_batch_goes_on(moody, kind, counter):
    out = moody.judge([_item("ok"), _item(kind), _item("ok")])
    assert out.rewards == [0.25, -1.0, 0.25]
    failures = {k: v for k, v in out.counters.items() if k.startswith("reward_fn_")}
    assert failures == {"reward_fn_errors": 0, "reward_fn_timeouts": 0, "reward_fn_bad_returns": 0, counter: 1}


def test_only_the_first_failure_of_each_kind_is_logged(caplog):
    with _router("reward_fns:by_question") as r, caplog.at_level(logging.WARNING, "oreal_fast.judge.router"):
        first = r.judge([_item(k) for k in ("ok", "str", "raise", "ok", "hang")])
        second = r.judge([_item(k) for k in ("raise", "hang", "none", "list")])
    assert first.rewards == [0.25, -1.0, -1.0, 0.25, -1.0] and second.rewards == [-1.0] * 4
    assert [second.counters[f"reward_fn_{k}"] for k in ("errors", "timeouts", "bad_returns")] == [1, 1, 2]
    lines = sorted(rec.getMessage() for rec in caplog.records)
    assert len(lines) == 3  # one per kind, all from the first batch
    assert all(line.startswith("reward_fn reward_fns:by_question, sample ") for line in lines)
    assert "sample 1 of the batch: returned str '0.5' (expected a float or a bool); scored -1" in lines[0]
    assert "sample 2 of the batch: raised KeyError: 'no such answer'; scored -1" in lines[1]
    assert "sample 4 of the batch: ran past its CPU limit of 0.3 s" in lines[2]


def test_returned_values_read_as_rewards():
    numpy = pytest.importorskip("numpy")
    assert reward_of(True) == (1.0, None, "") and reward_of(numpy.bool_(False)) == (-1.0, None, "")
    assert reward_of(3) == (3.0, None, "") and reward_of(numpy.float32(0.5)) == (0.5, None, "")
    assert reward_of(math.inf).failure == "bad_returns" and reward_of(b"1").failure == "bad_returns"
    assert reward_of("x" * 500).detail.endswith("... (expected a float or a bool)")


@pytest.mark.parametrize("spec, message", [
    ("no_such_reward_module:f", "module 'no_such_reward_module' cannot be loaded: ModuleNotFoundError: No module"
                                " named 'no_such_reward_module'"),
    ("reward_fns:no_such_function", "'reward_fns' has no attribute 'no_such_function'"),
    ("reward_fns:two_arguments", "'reward_fns:two_arguments' must accept three positional arguments (record,"
                                 " response, gold_answer); its signature is two_arguments(record: dict,"
                                 " response: str) -> float"),
    ("reward_fns:time", "'reward_fns:time' is a module, not a function"),
    ("reward_fns", "'reward_fns' is not of the form 'package.module:function' or 'path/to/file.py:function'"),
])
def test_start_up_check_names_what_is_wrong_in_one_line(spec, message):
    with pytest.raises(ValueError) as e:
        check_reward_fn(spec)
    assert str(e.value) == message


def test_start_up_check_of_a_file(tmp_path):
    assert check_reward_fn("reward_fns:weighted_match") == "reward_fns:weighted_match"
    path = tmp_path / "r.py"
    path.write_text("def f(record, response, gold, *, scale=1.0):\n    return 1.0\n")
    assert check_reward_fn(f"{path}:f") == f"{path}:f"
    with pytest.raises(ValueError, match=f"^file '{tmp_path}/missing.py' does not exist$"):
        check_reward_fn(f"{tmp_path}/missing.py:f")
    path.write_text("x = 1 / 0\n")
    with pytest.raises(ValueError, match=f"^file '{path}' cannot be loaded: ZeroDivisionError: division by zero$"):
        check_reward_fn(f"{path}:f")
