"""Prompt records: jsonl and datasets loading, error messages, balancing (reference 3.1, 3.2), demo set."""

import json
import re

import pytest

from oreal_fast.data import DataError, PromptRecord, balance_by_difficulty, load_prompt_records, resolve_path
from oreal_fast.data.make_demo_problems import make_problems

OFFICIAL_BUCKETS = [((0.0, 0.2), 6), ((0.2, 0.4), 4), ((0.4, 0.6), 4), ((0.6, 0.8), 2)]
GOOD = {"question": "What is 2 + 3?", "gold_answer": "5", "pass_rate": 0.25}


def _write(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_jsonl_loads_records_with_message_data_and_metadata(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD), json.dumps({**GOOD, "question": "Q2", "pass_rate": 1})])
    records = load_prompt_records(path)
    assert records == [PromptRecord("What is 2 + 3?", "5", 0.25), PromptRecord("Q2", "5", 1.0)]
    assert records[0].message_data == [{"role": "user", "content": "What is 2 + 3?"}]
    assert records[0].metadata == {"data_source": "math", "gold_answer": "5"}


def test_sources_concatenate_in_order_and_max_prompts_caps(tmp_path):
    a = _write(tmp_path, [json.dumps({**GOOD, "question": f"a{i}"}) for i in range(3)], "a.jsonl")
    b = _write(tmp_path, [json.dumps({**GOOD, "question": f"b{i}"}) for i in range(2)], "b.jsonl")
    assert [r.question for r in load_prompt_records([a, b])] == ["a0", "a1", "a2", "b0", "b1"]
    assert [r.question for r in load_prompt_records([a, b], max_prompts=4)] == ["a0", "a1", "a2", "b0"]


BAD_LINES = [
    ("{not json", "not valid JSON", None),
    ("[1, 2]", "expected a JSON object", None),
    (json.dumps({"gold_answer": "5", "pass_rate": 0.5}), "question", "missing"),
    (json.dumps({"question": "Q", "pass_rate": 0.5}), "gold_answer", "missing"),
    (json.dumps({**GOOD, "gold_answer": 5.0}), "gold_answer", "must be a string or an integer"),
    (json.dumps({**GOOD, "gold_answer": True}), "gold_answer", "must be a string or an integer"),
    (json.dumps({**GOOD, "gold_answer": None}), "gold_answer", "must be a string or an integer, got NoneType None"),
    (json.dumps({**GOOD, "gold_answer": " "}), "gold_answer", "empty"),
    (json.dumps({**GOOD, "question": None}), "question", "must be a string"),
    (json.dumps({**GOOD, "pass_rate": "0.5"}), "pass_rate", "must be a number"),
    (json.dumps({**GOOD, "pass_rate": True}), "pass_rate", "must be a number"),
    (json.dumps({**GOOD, "pass_rate": 1.5}), "pass_rate", "[0, 1]"),
    (json.dumps({**GOOD, "question": "  "}), "question", "empty"),
]


@pytest.mark.parametrize("bad_line, field, why", BAD_LINES)
def test_bad_line_names_file_line_and_field(tmp_path, bad_line, field, why):
    # line 1 good, line 2 blank (skipped but counted), line 3 bad
    path = _write(tmp_path, [json.dumps(GOOD), "", bad_line])
    with pytest.raises(DataError) as e:
        load_prompt_records(path)
    message = str(e.value)
    assert message.startswith(f"{path}:3: ")
    assert field in message
    if why:
        assert why in message


def test_pass_rate_is_optional_and_an_int_gold_answer_becomes_its_digits(tmp_path):
    path = _write(tmp_path, [json.dumps({"question": "Q", "gold_answer": 204}),
                             json.dumps({"question": "Q2", "gold_answer": "7", "pass_rate": None})])
    assert load_prompt_records(path) == [PromptRecord("Q", "204", None), PromptRecord("Q2", "7", None)]


def test_balancing_refuses_records_without_pass_rate_and_says_what_to_do():
    records = [PromptRecord("q0", "1", 0.1), PromptRecord("What is 9 - 4?", "5")]
    with pytest.raises(DataError, match=r"1 of 2 prompt records have no pass_rate \(first: 'What is 9 - 4\?'\)"
                       r".*data_difficulty_balance_cfg = None"):
        balance_by_difficulty(records, OFFICIAL_BUCKETS)
    assert balance_by_difficulty(records, None) == records


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_prompt_records(str(tmp_path / "nope.jsonl"))


def test_hf_dataset_source_loads_train_split_and_names_bad_rows(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    folder.mkdir()
    _write(folder, [json.dumps(GOOD), json.dumps({**GOOD, "question": "Q2"})], "train.jsonl")
    assert [r.question for r in load_prompt_records(str(folder))] == ["What is 2 + 3?", "Q2"]
    _write(folder, [json.dumps(GOOD), json.dumps({**GOOD, "gold_answer": None})], "train.jsonl")
    with pytest.raises(DataError, match=re.escape(f"{folder}:row 1: field 'gold_answer'")):
        load_prompt_records(str(folder))


def test_package_ref_resolves_inside_the_installed_package():
    path = resolve_path("package://oreal_fast/assets/demo_problems.jsonl")
    assert path.replace("\\", "/").endswith("oreal_fast/assets/demo_problems.jsonl")
    with pytest.raises(ValueError, match="not installed"):
        resolve_path("package://no_such_package_xyz/file.jsonl")


def _records(*pass_rates):
    return [PromptRecord(f"q{i}", str(i), p) for i, p in enumerate(pass_rates)]


def test_official_buckets_give_the_table_of_reference_3_2():
    records = _records(0.0, 0.1875, 0.2, 0.5, 0.75, 0.8, 1.0)
    out = balance_by_difficulty(records, OFFICIAL_BUCKETS)
    # copies adjacent, input order kept: 6, 6, 4, 4, 2, then 0.8 and 1.0 dropped
    expected = [records[0]] * 6 + [records[1]] * 6 + [records[2]] * 4 + [records[3]] * 4 + [records[4]] * 2
    assert out == expected


def test_first_matching_bucket_wins_and_unmatched_are_dropped():
    records = _records(0.3, 0.9, -0.1)
    out = balance_by_difficulty(records, [((0.0, 0.5), 3), ((0.2, 0.8), 1)])
    assert out == [records[0]] * 3


@pytest.mark.parametrize("cfg", [None, []])
def test_empty_balance_config_means_no_balancing(cfg):
    records = _records(0.0, 0.9, 1.0)
    assert balance_by_difficulty(records, cfg) == records


def test_demo_problems_file_is_what_the_generator_writes():
    path = resolve_path("package://oreal_fast/assets/demo_problems.jsonl")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines == [json.dumps(p) for p in make_problems()]


def test_demo_problems_are_valid_and_spread_over_difficulty():
    records = load_prompt_records("package://oreal_fast/assets/demo_problems.jsonl")
    assert 200 <= len(records) <= 400
    assert len({r.question for r in records}) == len(records)
    assert all(r.pass_rate * 16 == int(r.pass_rate * 16) for r in records)
    assert all(re.fullmatch(r"-?\d+", r.gold_answer) for r in records)
    counts = [sum(lo <= r.pass_rate < hi for r in records) for (lo, hi), _ in OFFICIAL_BUCKETS]
    assert all(n > 0 for n in counts)
    assert 0 < len(records) - sum(counts)  # some are easy enough to be dropped


_BARE = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def test_demo_gold_answers_of_bare_expressions_are_right():
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    checked = 0
    for r in load_prompt_records("package://oreal_fast/assets/demo_problems.jsonl"):
        m = _BARE.fullmatch(r.question)
        if m:
            assert int(r.gold_answer) == ops[m[2]](int(m[1]), int(m[3])), r.question
            checked += 1
    assert checked > 50
