"""Held-out evaluation: greedy pass@1, mean@n and pass@k of a policy on a set of problems, with intervals.

Prompts in, judged pass rates out. Responses come from any ``RolloutEngine`` (in a run, the
trainer's own), and a ``Router`` judges them from the same ``JudgeItem`` fields as training, so
"correct" means what the reward means. The trainer's validation (``val_*`` config keys) and
``python -m oreal_fast.eval`` both build :class:`Evaluator` with ``from_config``, which also loads
the held-out problems. Not here: loading models or config files, writing results.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code", eq. 1): with n samples of a problem of which c are correct,
pass@k = 1 - C(n - c, k) / C(n, k), computed per problem, then averaged over problems. mean@n is
the mean over problems of c / n (the same number as pass@1 from n samples).

Intervals (:meth:`EvalResult.estimates`) treat the problems as drawn from a larger population of
such problems (Miller 2024, "Adding Error Bars to Evals", arXiv 2411.00640): each metric is a mean
over problems of a per-problem score in [0, 1], and its 95% interval is the normal one,
mean +- 1.96 x the standard error over problems, clipped to [0, 1]. The sampling noise of the n
draws is inside each problem's score, so it is counted too. Greedy pass@1 scores each problem 0 or
1, and there the Wilson score interval replaces the normal one: it stays honest at 0 of N and N of N,
where the normal interval has width 0.

Invariant: an evaluation draws randomness only from a generator of its own, seeded afresh on each
call, so it never moves the training sample stream, and evaluating the same weights twice gives
the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import torch

from oreal_fast.data.chat import encode_prompt
from oreal_fast.config import TrainConfig
from oreal_fast.data.prompts import DataError, PromptRecord, load_prompt_records
from oreal_fast.data.sampler import repeat_k
from oreal_fast.judge import JudgeItem
from oreal_fast.rollout import RolloutEngine, SamplingParams, sampling_params

# Added to the run seed for the evaluation generator, so its draws differ from the first draws
# of the training stream (seeded with the run seed itself) instead of repeating them.
EVAL_SEED_OFFSET = 1_000_003

CONFIDENCE = 0.95
Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)  # 1.95996...: the two-sided 95% normal quantile


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: the chance that k of its n samples, drawn without
    replacement, hold at least one of the c correct ones (Chen et al. 2021, eq. 1).

    Args:
        n: samples drawn, >= 1.
        c: correct samples, 0 <= c <= n.
        k: 1 <= k <= n.
    """
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    # exact integer binomials; int / int is correctly rounded even when they are huge
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(n: int) -> list[int]:
    """The k of the reported pass@k for n samples per problem: the powers of two below n, then n
    (pass@1 is mean@n); none for n < 2."""
    return [2**i for i in range(1, n.bit_length()) if 2**i < n] + ([n] if n >= 2 else [])


def wilson_interval(successes: int, total: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (Wilson 1927): the shares p whose normal test
    against ``successes / total`` does not reject at 5%. Non-empty at 0 of N and at N of N.

    Raises:
        ValueError: not 0 <= successes <= total, or total < 1.
    """
    if not 0 <= successes <= total or total < 1:
        raise ValueError(f"wilson_interval needs 0 <= successes <= total and total >= 1; got {successes}, {total}")
    p, z2 = successes / total, Z * Z
    center = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = Z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return max(0.0, center - half), min(1.0, center + half)


def normal_interval(scores: Sequence[float]) -> tuple[float, float]:
    """95% normal interval of the mean of per-problem scores in [0, 1]: mean +- Z x s / sqrt(N), with s
    the sample standard deviation (N - 1 in its denominator), clipped to [0, 1]. One problem gives no
    spread to measure: [0, 1].

    Raises:
        ValueError: no scores.
    """
    num = len(scores)
    if num < 1:
        raise ValueError("normal_interval needs at least one score")
    if num == 1:
        return 0.0, 1.0
    mean = sum(scores) / num
    half = Z * math.sqrt(sum((x - mean) ** 2 for x in scores) / (num - 1) / num)
    return max(0.0, mean - half), min(1.0, mean + half)


@dataclass(frozen=True)
class Estimate:
    """A mean over problems and its 95% interval (see the module docstring for which interval)."""

    value: float
    low: float
    high: float


def _mean_estimate(scores: list[float]) -> Estimate:
    return Estimate(sum(scores) / len(scores), *normal_interval(scores))


def encode_prompts(tokenizer: Any, chat_template: str | None, records: Sequence[PromptRecord],
                   max_length: int) -> list[list[int]]:
    """Prompt token ids of each record, as the trainer renders them (reference 3.3).

    Raises:
        DataError: a prompt with no room for a response under ``max_length``.
    """
    return [encode_prompt(tokenizer, chat_template, r, max_length, what="a held-out prompt") for r in records]


@dataclass(frozen=True)
class ProblemResult:
    """One problem's verdicts: the greedy response and how many of n samples were correct."""

    question: str
    gold_answer: str
    greedy_response: str
    greedy_correct: bool
    num_correct: int  # of samples_per_problem sampled responses; 0 when none were drawn


@dataclass(frozen=True)
class EvalResult:
    """Per-problem verdicts of one evaluation; ``samples_per_problem`` = n (0: greedy only)."""

    problems: list[ProblemResult]
    samples_per_problem: int

    def metrics(self) -> dict[str, float | int]:
        """``val_num_problems``, ``val_greedy_pass1`` and, when samples were drawn, the mean over
        problems of sampled pass@1 and of pass@n (n = ``val_samples_per_problem``)."""
        num, n = len(self.problems), self.samples_per_problem
        out: dict[str, float | int] = {
            "val_num_problems": num,
            "val_greedy_pass1": sum(p.greedy_correct for p in self.problems) / num,
        }
        if n:
            out["val_sampled_pass1"] = sum(pass_at_k(n, p.num_correct, 1) for p in self.problems) / num
            out["val_pass_at_k"] = sum(pass_at_k(n, p.num_correct, n) for p in self.problems) / num
        return out

    def interval_metrics(self) -> dict[str, float]:
        """The 95% interval of each pass rate of :meth:`metrics` (from :meth:`estimates`) as
        ``<key>_low`` and ``<key>_high``: ``val_greedy_pass1`` (Wilson), and when samples were drawn
        ``val_sampled_pass1`` (= mean@n) and ``val_pass_at_k`` (= pass@n)."""
        n, estimates = self.samples_per_problem, self.estimates()
        pairs = [("val_greedy_pass1", "greedy pass@1")]
        if n:
            # pass@1 of one sample is mean@1, which estimates() lists once, as mean@1
            pairs += [("val_sampled_pass1", f"mean@{n}"), ("val_pass_at_k", f"pass@{n}" if n > 1 else "mean@1")]
        out: dict[str, float] = {}
        for key, name in pairs:
            out[f"{key}_low"], out[f"{key}_high"] = estimates[name].low, estimates[name].high
        return out

    def problem_rows(self) -> list[dict[str, Any]]:
        """One row per problem, in the evaluation's order, for comparing two evaluations of the
        same problems problem by problem: ``question``, ``greedy_correct``, ``num_correct`` of
        ``num_samples`` (= n; 0 = greedy only), and ``gold_answer`` and ``greedy_response`` to read
        what was judged (a verdict that looks too good is checked by reading the responses)."""
        return [{"question": p.question, "greedy_correct": p.greedy_correct, "num_correct": p.num_correct,
                 "num_samples": self.samples_per_problem, "gold_answer": p.gold_answer,
                 "greedy_response": p.greedy_response} for p in self.problems]

    def estimates(self) -> dict[str, Estimate]:
        """``greedy pass@1`` (Wilson interval) and, when n samples per problem were drawn, ``mean@n``
        and ``pass@k`` for each k of :func:`pass_ks` (normal intervals over problems), in that order."""
        num, n = len(self.problems), self.samples_per_problem
        greedy = sum(p.greedy_correct for p in self.problems)
        out = {"greedy pass@1": Estimate(greedy / num, *wilson_interval(greedy, num))}
        if n:
            out[f"mean@{n}"] = _mean_estimate([p.num_correct / n for p in self.problems])
            for k in pass_ks(n):
                out[f"pass@{k}"] = _mean_estimate([pass_at_k(n, p.num_correct, k) for p in self.problems])
        return out


class Evaluator:
    """Held-out problems and how to evaluate on them; ``evaluate`` generates and judges.

    Args:
        records: the problems; ``prompt_ids`` their token ids (from :func:`encode_prompts`).
        tokenizer: decodes responses for the judger (special tokens kept, as in training).
        params: the run's sampling settings; greedy uses them with ``do_sample=False``.
        samples_per_problem: n sampled responses per problem; 0 = greedy only.
        seed: the run seed; the evaluation generator starts at ``seed + EVAL_SEED_OFFSET``.
        device: where the generator lives (the model's device).
    """

    def __init__(self, records: Sequence[PromptRecord], prompt_ids: list[list[int]], *, tokenizer: Any,
                 params: SamplingParams, samples_per_problem: int, seed: int, device: torch.device) -> None:
        if not records or len(records) != len(prompt_ids):
            raise ValueError(f"Evaluator: {len(records)} records and {len(prompt_ids)} prompts; need the same, >= 1")
        self.records = list(records)
        self.prompt_ids = prompt_ids
        self.tokenizer = tokenizer
        self.params = params
        self.samples_per_problem = samples_per_problem
        self.seed = seed + EVAL_SEED_OFFSET
        self.device = device

    @classmethod
    def from_config(cls, cfg: TrainConfig, *, tokenizer: Any, stop_token_id: int, device: torch.device,
                    records: list[PromptRecord] | None = None) -> "Evaluator":
        """The evaluation a config asks for: ``val_datasets`` (first ``val_max_problems``), the
        run's chat template and sampling settings, ``val_samples_per_problem`` samples.

        ``records``: those problems when the caller has read them already (the trainer reads them
        before anything loads); None reads them here.

        Raises:
            DataError: unreadable or empty held-out data, or a prompt too long for gen_max_length.
        """
        if records is None:
            records = load_prompt_records(cfg.val_datasets, max_prompts=cfg.val_max_problems)
        if not records:
            raise DataError(f"val_datasets {cfg.val_datasets!r}: no problem to validate on")
        params = dataclasses.replace(sampling_params(cfg, stop_token_id), do_sample=True)
        prompt_ids = encode_prompts(tokenizer, cfg.chat_template, records, cfg.gen_max_length)
        return cls(records, prompt_ids, tokenizer=tokenizer, params=params,
                   samples_per_problem=cfg.val_samples_per_problem, seed=cfg.seed, device=device)

    def evaluate(self, rollout: RolloutEngine, router: Any) -> EvalResult:
        """One evaluation of the rollout's current weights.

        Args:
            rollout: generates; called once greedy, then once sampled when ``samples_per_problem`` > 0.
            router: judges (``judge(items) -> JudgeOutcome``), as in training.
        """
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        greedy = dataclasses.replace(self.params, do_sample=False)
        texts, greedy_ok = self._generate_and_judge(rollout, router, self.records, self.prompt_ids, greedy,
                                                    generator)
        n = self.samples_per_problem
        num_correct = [0] * len(self.records)
        if n:
            sampled = dataclasses.replace(self.params, do_sample=True)
            _, ok = self._generate_and_judge(rollout, router, repeat_k(self.records, n),
                                             repeat_k(self.prompt_ids, n), sampled, generator)
            num_correct = [sum(ok[i * n:(i + 1) * n]) for i in range(len(self.records))]
        problems = [ProblemResult(r.question, r.gold_answer, text, correct, c)
                    for r, text, correct, c in zip(self.records, texts, greedy_ok, num_correct)]
        return EvalResult(problems, n)

    def _generate_and_judge(self, rollout: RolloutEngine, router: Any, records: list[PromptRecord],
                            prompt_ids: list[list[int]], params: SamplingParams,
                            generator: torch.Generator) -> tuple[list[str], list[bool]]:
        responses = rollout.generate(prompt_ids, params, generator)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=False)
        items = [JudgeItem(question=r.question, response_text=t, gold_answer=r.gold_answer,
                           data_source=r.metadata["data_source"], record=dataclasses.asdict(r))
                 for r, t in zip(records, texts)]
        rewards = router.judge(items).rewards
        return texts, [r > 0 for r in rewards]


def validation_due(steps_done: int, interval: int, total_steps: int) -> bool:
    """Whether the trainer validates after ``steps_done`` steps: every ``interval`` (0 = never
    periodically) and always after the last step."""
    return steps_done == total_steps or (interval > 0 and steps_done % interval == 0)
