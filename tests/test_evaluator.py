"""Held-out evaluation without a model: the pass@k estimator against counting subsets, the
evaluator's metrics on a scripted rollout and judger, when the trainer validates, the validation
config keys, the validation log, and the demo's held-out split."""

from __future__ import annotations

import itertools
import json
import math
import os
import textwrap
from statistics import NormalDist

import pytest
import torch

from oreal_fast.config import ConfigError, load_config
from oreal_fast.data.make_demo_problems import make_val_problems
from oreal_fast.data.prompts import PromptRecord, load_prompt_records, resolve_path
from oreal_fast.evaluator import Evaluator, pass_at_k, validation_due
from oreal_fast.judge import JudgeOutcome
from oreal_fast.metrics import MetricsWriter
from oreal_fast.rollout import SamplingParams

from base_config import BASE, ROOT


@pytest.mark.parametrize("n,c,k", [(1, 0, 1), (1, 1, 1), (4, 1, 1), (4, 1, 2), (4, 2, 3), (5, 0, 5),
                                   (6, 3, 6), (7, 2, 4), (10, 9, 1), (10, 1, 10)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    share = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(share, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct_and_huge_n_stays_finite():
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)
    assert pass_at_k(1000, 3, 500) == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998))


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


class ByteTokenizer:
    """Decodes token ids as bytes, the one tokenizer call the evaluator makes."""

    def batch_decode(self, responses, skip_special_tokens):
        assert skip_special_tokens is False  # the judger needs the stop word, as in training
        return [bytes(r).decode() for r in responses]


class TableRollout:
    """Answers prompt p (one byte: its problem index) with ``greedy[p]`` when greedy, else with the
    next entry of ``sampled[p]``; logs (num_prompts, do_sample, generator) per call."""

    def __init__(self, greedy: list[str], sampled: list[list[str]]):
        self.greedy, self.sampled = greedy, [list(s) for s in sampled]
        self.calls = []

    def generate(self, prompts, params, generator):
        self.calls.append((len(prompts), params.do_sample, generator))
        texts = [self.greedy[p[0]] if not params.do_sample else self.sampled[p[0]].pop(0) for p in prompts]
        return [list(t.encode()) for t in texts]


class YesRouter:
    def __init__(self):
        self.items = []

    def judge(self, items):
        self.items += items
        return JudgeOutcome([1.0 if "yes" in it.response_text else -1.0 for it in items], {})


def make_evaluator(num: int, n: int) -> Evaluator:
    records = [PromptRecord(f"q{i}", str(i), 0.5) for i in range(num)]
    params = SamplingParams(max_new_tokens=8, max_length=16, temperature=0.7, do_sample=True)
    return Evaluator(records, [[i] for i in range(num)], tokenizer=ByteTokenizer(), params=params,
                     samples_per_problem=n, seed=3, device=torch.device("cpu"))


def test_metrics_equal_the_closed_form_of_the_scripted_verdicts():
    n = 4
    correct = [0, 1, 2, 4, 3]  # correct samples of each problem
    sampled = [["yes"] * c + ["no"] * (n - c) for c in correct]
    rollout = TableRollout(["yes", "no", "no", "yes", "no"], sampled)
    router = YesRouter()
    result = make_evaluator(len(correct), n).evaluate(rollout, router)
    assert [p.num_correct for p in result.problems] == correct
    assert [p.greedy_correct for p in result.problems] == [True, False, False, True, False]
    assert result.metrics() == {
        "val_num_problems": 5,
        "val_greedy_pass1": pytest.approx(2 / 5),
        "val_sampled_pass1": pytest.approx(sum(c / n for c in correct) / 5),
        "val_pass_at_k": pytest.approx(4 / 5),  # pass@n: a problem counts iff one of its n is correct
    }
    # one greedy call of every problem, then n copies of each, adjacent; judged with their golds
    assert [(num, sample) for num, sample, _ in rollout.calls] == [(5, False), (20, True)]
    assert [it.gold_answer for it in router.items] == [str(i) for i in range(5)] + [str(i) for i in range(5) for _ in range(n)]


def test_interval_keys_hold_the_closed_form_intervals_of_the_scripted_verdicts():
    n, z = 4, NormalDist().inv_cdf(0.975)
    correct = [0, 1, 2, 4, 3]
    rollout = TableRollout(["yes", "no", "no", "yes", "no"], [["yes"] * c + ["no"] * (n - c) for c in correct])
    result = make_evaluator(len(correct), n).evaluate(rollout, YesRouter())
    # greedy 2 of 5, Wilson: (p + z^2 / 2N  +-  z sqrt(p(1-p)/N + z^2 / 4N^2)) / (1 + z^2 / N)
    center, half = (0.4 + z * z / 10) / (1 + z * z / 5), z * math.sqrt(0.24 / 5 + z * z / 100) / (1 + z * z / 5)
    # mean@4 scores 0, .25, .5, 1, .75: mean .5, sample variance .625 / 4; pass@4 scores 0, 1, 1, 1, 1
    mean_half, pass_half = z * math.sqrt(0.625 / 4 / 5), z * math.sqrt(0.8 / 4 / 5)
    assert result.interval_metrics() == pytest.approx({
        "val_greedy_pass1_low": center - half, "val_greedy_pass1_high": center + half,
        "val_sampled_pass1_low": 0.5 - mean_half, "val_sampled_pass1_high": 0.5 + mean_half,
        "val_pass_at_k_low": 0.8 - pass_half, "val_pass_at_k_high": 1.0})  # clipped at 1
    assert result.problem_rows()[3] == {"question": "q3", "greedy_correct": True, "num_correct": 4, "num_samples": 4,
                                        "gold_answer": "3", "greedy_response": "yes"}


def test_one_sample_per_problem_gives_pass_at_1_the_interval_of_mean_at_1():
    z = NormalDist().inv_cdf(0.975)
    rollout = TableRollout(["no", "no", "yes"], [["no"], ["yes"], ["yes"]])
    keys = make_evaluator(3, 1).evaluate(rollout, YesRouter()).interval_metrics()
    # scores 0, 1, 1: mean 2/3, sample variance 1/3, standard error 1/3
    assert keys["val_sampled_pass1_low"] == keys["val_pass_at_k_low"] == pytest.approx(2 / 3 - z / 3)
    assert keys["val_sampled_pass1_high"] == keys["val_pass_at_k_high"] == 1.0


def test_greedy_only_evaluation_draws_nothing_and_reports_no_sampled_keys():
    rollout = TableRollout(["yes", "no"], [[], []])
    result = make_evaluator(2, 0).evaluate(rollout, YesRouter())
    assert [c[:2] for c in rollout.calls] == [(2, False)]
    assert result.metrics() == {"val_num_problems": 2, "val_greedy_pass1": 0.5}
    assert list(result.interval_metrics()) == ["val_greedy_pass1_low", "val_greedy_pass1_high"]


def test_each_evaluation_starts_its_own_generator_from_the_same_seed():
    evaluator = make_evaluator(1, 2)
    states = []

    class Recorder(TableRollout):
        def generate(self, prompts, params, generator):
            if params.do_sample:
                states.append(generator.get_state())
            return super().generate(prompts, params, generator)

    global_before = torch.get_rng_state()
    for _ in range(2):
        evaluator.evaluate(Recorder(["no"], [["yes", "no"]]), YesRouter())
    assert torch.equal(states[0], states[1])
    assert not torch.equal(states[0], torch.Generator().manual_seed(3).get_state())  # not the run seed's stream
    assert torch.equal(torch.get_rng_state(), global_before)


@pytest.mark.parametrize("steps_done,interval,total,due", [
    (1, 0, 4, False), (4, 0, 4, True), (2, 2, 5, True), (3, 2, 5, False), (5, 2, 5, True), (3, 10, 3, True),
])
def test_validation_is_due_every_interval_and_after_the_last_step(steps_done, interval, total, due):
    assert validation_due(steps_done, interval, total) is due


def _config(tmp_path, extra: str) -> str:
    path = tmp_path / "cfg.py"
    path.write_text(BASE + textwrap.dedent(extra), encoding="utf-8")
    return str(path)


VAL = 'val_datasets = "package://oreal_fast/assets/demo_problems_val.jsonl"\n'


@pytest.mark.parametrize("extra,key,why", [
    ("val_interval = 2\n", "val_interval", "val_datasets is None"),
    ("val_before_train = True\n", "val_before_train", "val_datasets is None"),
    (VAL + "val_interval = -1\n", "val_interval", "int >= 0"),
    (VAL + "val_samples_per_problem = -2\n", "val_samples_per_problem", "int >= 0"),
    (VAL + "val_max_problems = 0\n", "val_max_problems", ">= 1"),
    (VAL + "val_before_train = 1\n", "val_before_train", "expected bool"),
    ('val_datasets = "missing_val.jsonl"\n', "val_datasets", "does not exist"),
    ("val_datasets = []\n", "val_datasets", "non-empty"),
])
def test_bad_validation_settings_name_their_key(tmp_path, extra, key, why):
    path = _config(tmp_path, extra)
    with pytest.raises(ConfigError, match=why) as e:
        load_config(path)
    assert str(e.value).startswith(f"{key} in {path}")


def test_validation_settings_load_with_their_types(tmp_path):
    cfg = load_config(_config(tmp_path, VAL + "val_interval = 2\nval_before_train = True\n"
                                             "val_samples_per_problem = 4\nval_max_problems = 8\n"))
    assert (cfg.val_interval, cfg.val_before_train, cfg.val_samples_per_problem, cfg.val_max_problems) == (2, True, 4, 8)
    assert cfg.val_datasets.endswith("demo_problems_val.jsonl")


def test_validation_rows_go_to_their_own_file_text_log_and_survive_a_resume(tmp_path):
    writer = MetricsWriter(str(tmp_path), report_to=["none"])
    for step, value in ((0, 0.25), (2, 0.5), (4, 0.75)):
        problems = [{"question": f"q{i}", "greedy_correct": i < 4 * value} for i in range(4)]
        writer.write_validation(step, {"val_num_problems": 4, "val_greedy_pass1": value}, problems=problems)
    with open(tmp_path / "validation_problems" / "step-2.jsonl") as f:
        assert [json.loads(line)["greedy_correct"] for line in f] == [True, True, False, False]
    writer.truncate_after(2)  # a resume from step 2 redoes steps 3 and 4
    assert sorted(os.listdir(tmp_path / "validation_problems")) == ["step-0.jsonl", "step-2.jsonl"]
    with open(tmp_path / "validation.jsonl") as f:
        assert [json.loads(line) for line in f] == [
            {"step": 0, "val_num_problems": 4, "val_greedy_pass1": 0.25},
            {"step": 2, "val_num_problems": 4, "val_greedy_pass1": 0.5}]
    assert "[Validation after step 0] val_num_problems: 4 val_greedy_pass1: 0.2500" in (tmp_path / "rank0.log").read_text()
    assert not (tmp_path / "rank0.log.jsonl").exists()  # the official step file holds steps only


def test_demo_held_out_problems_are_disjoint_from_its_training_prompts():
    cfg = load_config(f"{ROOT}/configs/demo.py")
    train = load_prompt_records(cfg.datasets)
    held_out = load_prompt_records(cfg.val_datasets)
    norm = lambda q: " ".join(q.lower().split())
    assert len(held_out) == 64 and len({norm(r.question) for r in held_out}) == 64
    assert not {norm(r.question) for r in train} & {norm(r.question) for r in held_out}
    assert cfg.val_before_train and cfg.val_max_problems <= len(held_out)


def test_demo_held_out_file_is_what_the_generator_writes():
    with open(resolve_path("package://oreal_fast/assets/demo_problems_val.jsonl"), encoding="utf-8") as f:
        assert f.read().splitlines() == [json.dumps(p) for p in make_val_problems()]
