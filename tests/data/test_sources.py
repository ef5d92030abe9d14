"""Prompt sources: the dict form (split, field names, extractors) over JSONL, JSON, parquet and dataset
folders shaped like GSM8K, MATH-500 and AIME; start-up errors; exclude; config checks. No network."""

import json
import os

import datasets
import pytest

from oreal_fast.config import ConfigError, load_config
from oreal_fast.data import DataError, PromptRecord, load_prompt_records
from oreal_fast.data.sources import FileSource, extract_answer, parse_sources

from data_configs import write_config

# Three small sets in the shapes of the standard ones (our own problems, same field names and formats).
GSM8K_ROWS = [
    {"question": "Ana has 3 bags of 14 apples. How many apples?", "answer": "3 * 14 = <<3*14=42>>42\n#### 42"},
    {"question": "A shop sells 1,250 pens a day. How many in 2 days?", "answer": "1250 * 2 = 2500\n#### 2,500"},
]
GSM8K_GOLD = ["42", "2500"]
MATH500_ROWS = [
    {"problem": "Compute $\\frac{3}{6}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "answer": "\\frac{1}{2}",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    {"problem": "Solve $x^2=9$, $x>0$.", "solution": "Try $\\boxed{2}$; no: $\\boxed{3}$.", "answer": "3",
     "subject": "Algebra", "level": 2, "unique_id": "test/algebra/2.json"},
]
MATH500_GOLD = ["\\frac{1}{2}", "3"]
AIME_ROWS = [
    {"ID": "2024-I-1", "Problem": "Find the remainder of 2^10 by 1000.", "Solution": "1024.", "Answer": 24},
    {"ID": "2024-I-2", "Problem": "How many primes are below 20?", "Solution": "2..19.", "Answer": 8},
]
AIME_GOLD = ["24", "8"]

SHAPES = {  # name -> rows, the dict source's field names and extractor, the expected gold answers
    "gsm8k": (GSM8K_ROWS, {"question": "question", "answer": "answer", "extract": "gsm8k"}, GSM8K_GOLD),
    "math500": (MATH500_ROWS, {"question": "problem", "answer": "answer"}, MATH500_GOLD),
    "math500_solution": (MATH500_ROWS, {"question": "problem", "answer": "solution", "extract": "boxed"},
                         MATH500_GOLD),
    "aime": (AIME_ROWS, {"question": "Problem", "answer": "Answer"}, AIME_GOLD),
}


def _write(folder, rows, fmt, name="data"):
    """rows -> folder/name.<fmt>, written by `datasets` (JSONL, a JSON array) or pyarrow (parquet)."""
    path = os.path.join(folder, f"{name}.{fmt}")
    table = datasets.Dataset.from_list(rows)
    if fmt == "parquet":
        table.to_parquet(path)
    else:
        table.to_json(path, lines=fmt == "jsonl")
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_standard_shapes_load_in_every_format(tmp_path, shape, fmt):
    rows, fields, gold = SHAPES[shape]
    path = _write(tmp_path, rows, fmt)
    records = load_prompt_records({"path": path, **fields})
    question_field = fields["question"]
    assert records == [PromptRecord(r[question_field], g, None, "math") for r, g in zip(rows, gold)]


def test_a_json_array_written_by_hand_reads_like_jsonl(tmp_path):
    path = tmp_path / "aime.json"
    path.write_text(json.dumps(AIME_ROWS), encoding="utf-8")
    records = load_prompt_records({"path": str(path), "question": "Problem", "answer": "Answer"})
    assert [r.gold_answer for r in records] == AIME_GOLD


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_a_wrong_field_name_names_the_fields_the_file_has(tmp_path, fmt):
    path = _write(tmp_path, MATH500_ROWS, fmt)
    with pytest.raises(DataError) as e:
        load_prompt_records({"path": path, "question": "question", "answer": "answer"})
    message = str(e.value)
    assert message.startswith(path) and "'question'" in message
    assert "problem, solution, answer, subject, level, unique_id" in message


def test_plain_string_parquet_uses_the_default_fields_and_reads_pass_rate(tmp_path):
    rows = [{"question": "Q1", "gold_answer": "1", "pass_rate": 0.25}, {"question": "Q2", "gold_answer": "2",
                                                                       "pass_rate": 1.0}]
    path = _write(tmp_path, rows, "parquet")
    assert load_prompt_records(path) == [PromptRecord("Q1", "1", 0.25), PromptRecord("Q2", "2", 1.0)]


def _dataset_folder(tmp_path):
    folder = tmp_path / "gsm8k_like"
    folder.mkdir()
    _write(folder, GSM8K_ROWS[:1], "jsonl", name="train")
    _write(folder, GSM8K_ROWS[1:], "jsonl", name="test")
    return str(folder)


def test_a_dataset_folder_gives_the_asked_split(tmp_path):
    folder = _dataset_folder(tmp_path)
    source = {"path": folder, "question": "question", "answer": "answer", "extract": "gsm8k"}
    assert [r.gold_answer for r in load_prompt_records(source)] == ["42"]  # split train by default
    assert [r.gold_answer for r in load_prompt_records({**source, "split": "test"})] == ["2500"]


def test_a_missing_split_names_the_splits_the_dataset_has(tmp_path):
    folder = _dataset_folder(tmp_path)
    with pytest.raises(DataError) as e:
        load_prompt_records({"path": folder, "split": "validation", "question": "question", "answer": "answer"})
    assert str(e.value).startswith(f"{folder} (split validation): no split 'validation'; it has ")
    assert sorted(str(e.value).split("it has ")[1].split(" (")[0].split(", ")) == ["test", "train"]


def test_a_missing_subset_is_a_one_line_data_error(tmp_path):
    folder = _dataset_folder(tmp_path)
    with pytest.raises(DataError, match=r"cannot be loaded \(ValueError: .*'nosuch'.*'default'"):
        load_prompt_records({"path": folder, "subset": "nosuch", "question": "question", "answer": "answer"})


def test_an_answer_without_the_extractors_format_names_the_row(tmp_path):
    rows = [GSM8K_ROWS[0], {"question": "No final line here", "answer": "The answer is 5."}]
    path = _write(tmp_path, rows, "jsonl")
    with pytest.raises(DataError, match=f"{path}:2: field 'answer' has no final '#### N' "
                                        r"\(extract='gsm8k'\)"):
        load_prompt_records({"path": path, "question": "question", "answer": "answer", "extract": "gsm8k"})


@pytest.mark.parametrize("text, how, expected", [
    ("3 * 14 = 42\n#### 42", "gsm8k", "42"),
    ("#### 1,234,567", "gsm8k", "1234567"),
    ("#### -1,000.5", "gsm8k", "-1000.5"),
    ("#### 3, 4", "gsm8k", "3, 4"),  # not one number with separators: kept as written
    ("first #### 1\nthen #### 2 ", "gsm8k", "2"),
    ("no marker 42", "gsm8k", None),
    ("so $\\boxed{\\frac{1}{2}}$.", "boxed", "\\frac{1}{2}"),
    ("\\boxed{1} or rather \\boxed{ \\{2, 3\\} }", "boxed", " \\{2, 3\\} "),
    ("\\fbox{7}", "boxed", "7"),
    ("\\boxed {x^{2}}", "boxed", "x^{2}"),
    ("\\boxed{\\frac{1}{2}", "boxed", None),
    ("42", "boxed", None),
    (" 42 ", "plain", " 42 "),
])
def test_extractors(text, how, expected):
    assert extract_answer(text, how) == expected


BAD_SOURCES = [
    ({"path": "a.jsonl", "quesiton": "q"}, "unknown key 'quesiton'; did you mean 'question'?"),
    ({"path": "a.jsonl", "extract": "last_number"}, "'extract' must be one of plain, gsm8k, boxed"),
    ({"path": "a.parquet", "split": "test"}, "one local file, read whole: it has no split"),
    ({"path": "a.jsonl", "answer": ""}, "'answer' must be a non-empty str"),
    ({"question": "q"}, "needs 'path'"),
    ({"path": "a.jsonl", "reasoning_gym": "chain_sum"}, "either 'path' or 'reasoning_gym'"),
    ({"path": "a.jsonl", "exclude": [{"path": "b.jsonl", "spilt": "x"}]}, "'exclude': unknown key 'spilt'"),
    ([], "non-empty list"),
    (["a.jsonl", 3], "entry 1: expected a str or a dict, got int 3"),
]


@pytest.mark.parametrize("value, why", BAD_SOURCES)
def test_bad_source_forms_are_one_line_errors(value, why):
    with pytest.raises(ValueError) as e:
        parse_sources(value)
    assert why in str(e.value)
    with pytest.raises(DataError) as d:
        load_prompt_records(value)
    assert why in str(d.value)


def test_the_string_form_is_the_dict_form_with_default_fields():
    assert parse_sources("x.jsonl") == [FileSource("x.jsonl", None, None, "question", "gold_answer", "plain")]


def test_exclude_drops_the_questions_of_other_sources(tmp_path):
    train = _write(tmp_path, GSM8K_ROWS[:1], "jsonl", name="train")
    held_out = _write(tmp_path, GSM8K_ROWS, "parquet", name="held_out")
    fields = {"question": "question", "answer": "answer", "extract": "gsm8k"}
    records = load_prompt_records({"path": held_out, **fields, "exclude": {"path": train, **fields}})
    assert [r.question for r in records] == [GSM8K_ROWS[1]["question"]]


# ----------------------------------------------------------------------------- config checks at start-up


def test_dict_sources_pass_the_config_and_load_for_training_and_validation(tmp_path):
    train = _write(tmp_path, GSM8K_ROWS, "parquet", name="train")
    test = _write(tmp_path, MATH500_ROWS, "json", name="test")
    cfg = load_config(write_config(tmp_path, f"""
        datasets = {{"path": {train!r}, "question": "question", "answer": "answer", "extract": "gsm8k"}}
        val_datasets = [{{"path": {test!r}, "question": "problem", "answer": "answer", "data_source": "olympiad"}}]
        judgers_config = dict(math_judger=dict(hosts=[], rule_only=True),
                              strict_judger=dict(hosts=[], rule_only=True, rule_mode="strict"))
        data_judger_mapping = dict(math=["math_judger"], olympiad=["strict_judger"])
    """))
    assert [r.gold_answer for r in load_prompt_records(cfg.datasets)] == GSM8K_GOLD
    held_out = load_prompt_records(cfg.val_datasets)
    assert [r.metadata for r in held_out] == [{"data_source": "olympiad", "gold_answer": g} for g in MATH500_GOLD]


@pytest.mark.parametrize("body, key, why", [
    ('datasets = {"path": "gone.parquet"}', "datasets", "file 'gone.parquet' does not exist"),
    ('datasets = {"path": "x.jsonl", "extract": "hash"}', "datasets", "'extract' must be one of"),
    ('datasets = "package://oreal_fast/assets/demo_problems.jsonl"\n'
     'val_datasets = {"path": "package://oreal_fast/assets/demo_problems_val.jsonl", "data_source": "geo"}',
     "data_judger_mapping", "no entry for data_source 'geo', which val_datasets uses"),
])
def test_config_checks_sources_at_start_up(tmp_path, body, key, why):
    path = write_config(tmp_path, body + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{key} in {path}: ") and why in str(e.value)


def test_config_without_datasets_package_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    path = write_config(tmp_path, 'datasets = "openai/gsm8k"\n')
    with pytest.raises(ConfigError, match=r"datasets in .*'datasets' package.*pip install 'oreal-fast\[datasets\]'"):
        load_config(path)
