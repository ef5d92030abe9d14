"""reasoning-gym sources: sizes and order, seeds, a held-out set that shares no question with training,
gold answers our rule judger confirms, and the start-up checks."""

import decimal
from fractions import Fraction

import pytest
from reasoning_gym import create_dataset

from oreal_fast.config import ConfigError, load_config
from oreal_fast.data import DataError, load_prompt_records
from oreal_fast.data.procedural import draw
from oreal_fast.data.sources import parse_source
from oreal_fast.judge import JudgeItem, Router

from data_configs import write_config

TASKS = ["basic_arithmetic", "chain_sum", "fraction_simplification", "gsm_symbolic"]
# 2 one-digit terms: at most 10 x 10 x 2 distinct questions, so independent draws collide
NARROW = {"chain_sum": {"size": 60, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def test_each_task_gives_its_size_interleaved_in_task_order():
    problems = draw(parse_source({"reasoning_gym": {"chain_sum": 3, "gsm_symbolic": 1, "gcd": 2}, "seed": 5}))
    assert [p.task for p in problems] == ["chain_sum", "gsm_symbolic", "gcd", "chain_sum", "gcd", "chain_sum"]
    records = load_prompt_records({"reasoning_gym": {"chain_sum": 3, "gsm_symbolic": 1, "gcd": 2}, "seed": 5})
    assert [r.question for r in records] == [p.entry["question"] for p in problems]
    assert [r.gold_answer for r in records] == [p.entry["answer"] for p in problems]
    assert {(r.pass_rate, r.data_source) for r in records} == {(None, "math")}


def test_the_same_source_gives_the_same_questions_and_another_seed_others():
    source = {"reasoning_gym": TASKS, "size": 20, "seed": 3}
    first = [r.question for r in load_prompt_records(source)]
    assert first == [r.question for r in load_prompt_records(source)]
    other = {r.question for r in load_prompt_records({**source, "seed": 4})}
    assert len(set(first) & other) <= 2  # only chance coincidences of small tasks


def test_neighbouring_seeds_do_not_share_reasoning_gyms_items():
    # reasoning-gym itself builds item i from Random(seed + i): seeds 1 and 2 share all items but one
    raw = [{create_dataset("basic_arithmetic", seed=s, size=30)[i]["question"] for i in range(30)} for s in (1, 2)]
    assert len(raw[0] & raw[1]) == 29
    ours = [{r.question for r in load_prompt_records({"reasoning_gym": "basic_arithmetic", "size": 30, "seed": s})}
            for s in (1, 2)]
    assert not ours[0] & ours[1]


@pytest.mark.parametrize("tasks", [TASKS, NARROW], ids=["default_options", "narrow_chain_sum"])
def test_held_out_set_shares_no_question_with_training(tasks):
    train = {"reasoning_gym": tasks, "seed": 1, **({"size": 60} if isinstance(tasks, list) else {})}
    held_out = {**train, "seed": 2, "exclude": train}
    train_questions = [r.question for r in load_prompt_records(train)]
    held_out_questions = [r.question for r in load_prompt_records(held_out)]
    assert len(held_out_questions) == len(set(held_out_questions)) == len(train_questions) == 60 * len(tasks)
    assert not set(train_questions) & set(held_out_questions)


def test_without_exclude_a_small_question_space_repeats_training_questions():
    # what the exclude in the test above protects against
    train = {r.question for r in load_prompt_records({"reasoning_gym": NARROW, "seed": 1})}
    held_out = {r.question for r in load_prompt_records({"reasoning_gym": NARROW, "seed": 2})}
    assert len(train & held_out) > 5


def test_drawing_leaves_the_process_decimal_precision_alone():
    before = decimal.getcontext().prec
    problems = draw(parse_source({"reasoning_gym": "decimal_arithmetic", "size": 3}))
    assert len(problems) == 3 and decimal.getcontext().prec == before  # the task sets it to 12 per item


def test_too_few_distinct_questions_is_a_data_error():
    source = {"reasoning_gym": {"chain_sum": {**NARROW["chain_sum"], "size": 300}}, "seed": 1}
    with pytest.raises(DataError, match=r"reasoning_gym chain_sum \(seed 1\): task 'chain_sum' gave only \d+ "
                                        r"distinct new questions in 1300 draws \(size 300\)"):
        load_prompt_records(source)


def test_gold_answers_in_inline_math_lose_their_dollars():
    problems = draw(parse_source({"reasoning_gym": "fraction_simplification", "size": 40, "seed": 0}))
    raw = [p.entry["answer"] for p in problems]
    gold = [r.gold_answer for r in load_prompt_records({"reasoning_gym": "fraction_simplification", "size": 40})]
    assert any(a.startswith("$\\") for a in raw)  # the task's latex styles answer in inline math
    assert gold == [a[1:-1] if a.startswith("$") else a for a in raw]
    assert not any("$" in g for g in gold)


def test_the_rule_judger_confirms_every_gold_answer_and_rejects_a_wrong_one():
    records = load_prompt_records({"reasoning_gym": TASKS + ["products", "gcd", "lcm"], "size": 6, "seed": 9})
    right = [JudgeItem(r.question, f"So the result is \\boxed{{{r.gold_answer}}}.<|im_end|>", r.gold_answer)
             for r in records]
    wrong = [JudgeItem(r.question, "So the result is \\boxed{-987654321}.<|im_end|>", r.gold_answer) for r in records]
    with Router({"math_judger": {"hosts": [], "rule_only": True, "num_processes": 2}},
                {"math": ["math_judger"]}) as router:
        assert router.judge(right).rewards == [1.0] * len(records)
        assert router.judge(wrong).rewards == [-1.0] * len(records)


def test_a_config_trains_and_validates_on_reasoning_gym(tmp_path):
    cfg = load_config(write_config(tmp_path, """
        _tasks = {"chain_sum": 40, "gsm_symbolic": 40}
        datasets = {"reasoning_gym": _tasks, "seed": 1}
        val_datasets = {"reasoning_gym": {"chain_sum": 10, "gsm_symbolic": 10}, "seed": 2, "exclude": datasets}
        data_difficulty_balance_cfg = None
    """))
    train, held_out = load_prompt_records(cfg.datasets), load_prompt_records(cfg.val_datasets)
    assert (len(train), len(held_out)) == (80, 20)
    assert not {r.question for r in train} & {r.question for r in held_out}


@pytest.mark.parametrize("body, key, why", [
    ('datasets = {"reasoning_gym": "chain_sums", "size": 10}', "datasets",
     "reasoning_gym has no task 'chain_sums'; did you mean 'chain_sum'?"),
    ('datasets = {"reasoning_gym": {"chain_sum": {"size": 10, "max_term": 3}}}', "datasets",
     "task 'chain_sum' has no option 'max_term'; its options: min_terms, max_terms, min_digits"),
    ('datasets = {"reasoning_gym": {"chain_sum": {"size": 10, "min_terms": 5, "max_terms": 2}}}', "datasets",
     "bad options {'min_terms': 5, 'max_terms': 2}: max_terms must be >= min_terms"),
    ('datasets = {"reasoning_gym": {"basic_arithmetic": {"size": 10, "allow_parentheses": False}}}', "datasets",
     "'basic_arithmetic' with allow_parentheses=False: its answers are computed as if the expression kept"),
    ('datasets = {"reasoning_gym": ["chain_sum"]}', "datasets", "'size' (problems per task) is required"),
    ('datasets = {"reasoning_gym": {"chain_sum": 0}}', "datasets", "size must be an int in [1, 200000], got 0"),
    ('datasets = {"reasoning_gym": "chain_sum", "size": 10, "seed": -1}', "datasets", "'seed' must be an int"),
    ('datasets = {"reasoning_gym": "chain_sum", "size": 10}', "data_difficulty_balance_cfg",
     "reasoning_gym problems, which have no pass_rate"),
])
def test_config_checks_reasoning_gym_sources_at_start_up(tmp_path, body, key, why):
    balance = "" if key == "data_difficulty_balance_cfg" else "data_difficulty_balance_cfg = None\n"
    path = write_config(tmp_path, balance + body + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{key} in {path}: ") and why in str(e.value)


def test_without_the_package_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)  # makes the import fail
    path = write_config(tmp_path, 'data_difficulty_balance_cfg = None\ndatasets = {"reasoning_gym": "gcd", "size": 5}\n')
    with pytest.raises(ConfigError, match=r"pip install 'oreal-fast\[reasoning-gym\]'"):
        load_config(path)


def test_basic_arithmetic_without_parentheses_writes_wrong_golds():
    """Why the option is refused: the shown expression's value differs from the gold on many items
    (if a reasoning-gym release fixes this, this test fails and the refusal can go)."""
    def value(question: str) -> Fraction:
        expr = question.removeprefix("Calculate ").rstrip(".").strip()
        tokens = expr.split()  # "34 + 17 * 23": numbers and operators separated by spaces
        terms, ops = [Fraction(tokens[0])], []
        for op, number in zip(tokens[1::2], tokens[2::2]):
            n = Fraction(number)
            if op in "*/":
                terms[-1] = terms[-1] * n if op == "*" else terms[-1] / n
            else:
                terms.append(n if op == "+" else -n)
        return sum(terms)

    for allow, at_least, at_most in ((False, 40, 200), (True, 0, 0)):
        ds = create_dataset("basic_arithmetic", size=200, seed=5, max_terms=3, max_digits=2,
                                          allow_parentheses=allow)
        entries = [e for e in ds if "(" not in e["question"]]
        wrong = sum(value(e["question"]) != Fraction(e["answer"]) for e in entries)
        assert at_least <= wrong <= at_most, (allow, wrong, len(entries))
