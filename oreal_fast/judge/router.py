"""Judge a step's samples: route by data source, rule check in workers, LLM verifier on misses.

Decision per sample (reference 4.3), with the judger the sample's data source maps to:

1. ``response_text.strip()`` does not end with the stop word -> -1 (counted: no_stop_word).
   A response that stopped on ``<|endoftext|>`` instead of ``<|im_end|>`` fails here too.
2. For each thinking-finish word in order, keep only the text after its last occurrence.
3. Remove every occurrence of the stop word.
4. Rule check (official or strict, in a worker under a CPU-time limit): a match -> +1
   (counted: rule_confirmed). The rule never rejects. A check over its limit is a miss
   (counted: rule_timeouts).
5. Otherwise, unless rule_only, ask the LLM verifier with the whole text of step 3
   (counted: verifier_calls): graded correct -> +1, wrong -> -1, no grade after the
   retries -> -1 (counted: verifier_failures). With rule_only a miss is -1.

An item whose question, response or gold answer is not a string, or whose gold answer is
blank, cannot be judged: -1 (counted: invalid_items), without a rule check or a verifier
call, and the rest of the batch is judged as usual.

Rule checks run in worker processes and verifier calls in threads; a sample whose rule
check misses goes to the verifier as soon as its verdict arrives, while other checks go on.

With a ``reward_fn`` (docs/rewards.md) the user's function replaces steps 1-5 for every sample:
it gets the prompt record, the whole decoded response and the gold answer in a worker, under
the ``rule_timeout_s`` of the sample's judger; a bool scores +1 / -1, a finite number is the
reward. A call that raises, runs past its limit or returns anything else scores -1 (as a failed
rule check with no verifier), is counted (reward_fn_errors, reward_fn_timeouts,
reward_fn_bad_returns) and, the first time of its kind, logged with the sample's index.

What it does not: no tensors, no reward shaping; rewards go back as plain floats.

Invariant: `judge` returns exactly one finite reward per item, in input order (in {+1.0, -1.0}
without a reward_fn), and returns within bounded time (time limits per sample + verifier
timeouts and retries).
"""

import concurrent.futures
import dataclasses
import logging
import random

from oreal_fast.judge.pool import OFFICIAL_CHECK, STRICT_CHECK, RulePool, RuleTask, RuleVerdict
from oreal_fast.judge.reward_fn import FAILED_REWARD, FAILURE_KINDS, RewardAnswer, RewardTask, absolute_spec
from oreal_fast.judge.settings import MathJudgerSettings, parse_judger_settings
from oreal_fast.judge.verifier import VerifierClient

RULE_CHECKS = {"official": OFFICIAL_CHECK, "strict": STRICT_CHECK}  # rule_mode -> check the workers run
COUNTER_KEYS = ("rule_confirmed", "verifier_calls", "verifier_failures", "rule_timeouts", "no_stop_word",
                "invalid_items")
REWARD_FN_COUNTER_KEYS = tuple(f"reward_fn_{kind}" for kind in FAILURE_KINDS)  # added when a reward_fn is set

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One sample to judge: the user question, the raw decoded response, the gold answer; ``record``
    is the whole prompt record, a reward_fn's first argument (None: the three fields above)."""

    question: str
    response_text: str
    gold_answer: str
    data_source: str = "math"
    record: dict | None = None

    def record_dict(self) -> dict:
        """A copy of the prompt record a reward_fn gets."""
        if self.record is not None:
            return dict(self.record)
        return {"question": self.question, "gold_answer": self.gold_answer, "data_source": self.data_source}


@dataclasses.dataclass(frozen=True)
class JudgeOutcome:
    """rewards: one per item, input order (+1.0 / -1.0, or a reward_fn's); counters: COUNTER_KEYS
    (and REWARD_FN_COUNTER_KEYS with a reward_fn) -> count."""

    rewards: list[float]
    counters: dict[str, int]


def _judgeable(item: object) -> bool:
    """A JudgeItem with str question and response and a non-blank str gold answer.

    str(None) would make "None" a gold answer that ``\\boxed{None}`` matches.
    """
    return (
        isinstance(item, JudgeItem)
        and isinstance(item.question, str)
        and isinstance(item.response_text, str)
        and isinstance(item.gold_answer, str)
        and bool(item.gold_answer.strip())
    )


def prepare_text(response_text: str, s: MathJudgerSettings) -> str | None:
    """Steps 1-3 of the decision: None if the response did not end with the stop word."""
    if not response_text.strip().endswith(s.stop_word):
        return None
    text = response_text
    for word in s.thinking_finish_words:
        if word in text:
            text = text.rsplit(word, 1)[1]
    return text.replace(s.stop_word, "")


class Router:
    """Judges batches of samples with the judgers of ``judgers_config``.

    Args:
        judgers_config: judger name -> settings dict (see settings.py for the keys).
        data_judger_mapping: data_source -> list of judger names; the first one judges
            (the official trainer also used only the first judger's reward).
        reward_fn: ``"package.module:function"`` or ``"path/to/file.py:function"`` that scores
            every sample instead (config.py checks it at start-up); the judgers then only give
            each sample its CPU limit (rule_timeout_s) and the pool its size (num_processes).

    Raises:
        ValueError: no judger, a bad judger entry, or a mapping naming a judger that is not
            configured.
    """

    def __init__(self, judgers_config: dict, data_judger_mapping: dict, reward_fn: str | None = None) -> None:
        if not judgers_config:
            raise ValueError("judgers_config: no judger configured (e.g. math_judger=dict(rule_only=True))")
        self._judgers = {n: parse_judger_settings(n, raw) for n, raw in judgers_config.items()}
        self._route: dict[str, str] = {}
        for source, names in data_judger_mapping.items():
            names = [names] if isinstance(names, str) else list(names)
            if not names or names[0] not in self._judgers:
                raise ValueError(
                    f"data_judger_mapping.{source}: {names!r} names no judger of judgers_config"
                    f" (have: {sorted(self._judgers)})"
                )
            self._route[source] = names[0]
        # The official judger drew its first host with random.randint on the global RNG at
        # construction; drawing the same keeps later global-RNG draws (the trajectory
        # filter's) in step with the official trainer.
        self._clients = {
            n: VerifierClient(s, start=random.randint(0, len(s.hosts) - 1))
            for n, s in self._judgers.items()
            if s.hosts and not s.rule_only
        }
        # made absolute here, so that the workers find the file whatever their working folder
        self._reward_fn = None if reward_fn is None else absolute_spec(reward_fn)
        self._pool = RulePool(max(s.num_processes for s in self._judgers.values()),
                              preload=() if self._reward_fn is None else (self._reward_fn,))
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(s.max_concurrency for s in self._judgers.values()),
            thread_name_prefix="verifier",
        )
        self._logged_failures: set[str] = set()  # reward_fn failure kinds already logged once

    def judge(self, items: list[JudgeItem]) -> JudgeOutcome:
        """Judge one step's samples concurrently.

        Raises:
            ValueError: an item whose data_source has no entry in data_judger_mapping.
        """
        counters = dict.fromkeys(COUNTER_KEYS + (REWARD_FN_COUNTER_KEYS if self._reward_fn else ()), 0)
        rewards: list[float | None] = [None] * len(items)
        if self._reward_fn is not None:
            self._reward_fn_rewards(items, rewards, counters)
        else:
            self._rule_and_verifier_rewards(items, rewards, counters)
        if counters["invalid_items"]:
            log.warning("judger: %d of %d item(s) scored -1 unjudged: a question, response or gold"
                        " answer that is not a string, or a blank gold answer",
                        counters["invalid_items"], len(items))
        return JudgeOutcome(rewards=[float(r) for r in rewards], counters=counters)

    def _rule_and_verifier_rewards(self, items: list[JudgeItem], rewards: list[float | None],
                                   counters: dict[str, int]) -> None:
        """Steps 1-5 for every item, in place."""
        tasks, owners = self._rule_tasks(items, rewards, counters)
        calls = self._verifier_calls(items, tasks, owners, rewards, counters)
        for future, i in calls.items():
            grade = future.result()
            if grade is None:
                counters["verifier_failures"] += 1
            rewards[i] = 1.0 if grade else -1.0

    def _reward_fn_rewards(self, items: list[JudgeItem], rewards: list[float | None],
                           counters: dict[str, int]) -> None:
        """The reward_fn's reward for every judgeable item, in place; a failed call scores
        FAILED_REWARD, counted, and the first of its kind is logged."""
        tasks, owners = [], []
        for i, item in enumerate(items):
            if self._judgeable_or_scored(i, item, rewards, counters):
                timeout_s = self._settings_for(item).rule_timeout_s
                tasks.append(RewardTask(self._reward_fn, item.record_dict(), item.response_text, item.gold_answer,
                                        timeout_s))
                owners.append(i)
        for j, answer in self._pool.run(tasks):
            i = owners[j]
            if answer is RuleVerdict.TIMED_OUT:
                answer = RewardAnswer(None, "timeouts", f"ran past its CPU limit of {tasks[j].timeout_s:g} s"
                                      " (rule_timeout_s; or its worker died)")
            rewards[i] = answer.reward if answer.failure is None else self._failed(i, answer, counters)

    def _failed(self, i: int, answer: RewardAnswer, counters: dict[str, int]) -> float:
        """FAILED_REWARD for item i's failed call, counted; the first failure of each kind is logged."""
        counters[f"reward_fn_{answer.failure}"] += 1
        if answer.failure not in self._logged_failures:
            self._logged_failures.add(answer.failure)
            log.warning("reward_fn %s, sample %d of the batch: %s; scored %g (counted in judger_reward_fn_%s;"
                        " later such failures are counted, not logged)",
                        self._reward_fn, i, answer.detail, FAILED_REWARD, answer.failure)
        return FAILED_REWARD

    def _judgeable_or_scored(self, i: int, item: JudgeItem, rewards: list[float | None],
                             counters: dict[str, int]) -> bool:
        """True for an item that can be judged; any other gets reward -1 here (counted)."""
        if _judgeable(item):
            return True
        rewards[i] = -1.0
        counters["invalid_items"] += 1
        return False

    def _rule_tasks(self, items: list[JudgeItem], rewards: list[float | None],
                    counters: dict[str, int]) -> tuple[list[RuleTask], list[int]]:
        """The rule check of every judgeable item that reached its stop word, and ``owners[j]``, the
        item of task j; the others get reward -1 here (counted)."""
        tasks, owners = [], []
        for i, item in enumerate(items):
            if not self._judgeable_or_scored(i, item, rewards, counters):
                continue
            s = self._settings_for(item)
            text = prepare_text(item.response_text, s)
            if text is None:
                rewards[i] = -1.0
                counters["no_stop_word"] += 1
                continue
            tasks.append(RuleTask(RULE_CHECKS[s.rule_mode], text, item.gold_answer, s.rule_timeout_s))
            owners.append(i)
        return tasks, owners

    def _verifier_calls(self, items: list[JudgeItem], tasks: list[RuleTask], owners: list[int],
                        rewards: list[float | None], counters: dict[str, int]) -> dict[concurrent.futures.Future, int]:
        """Runs the rule checks; a confirmed item gets +1, the others go to their judger's verifier
        (-1 without one). Returns the verifier calls in flight -> their item."""
        calls: dict[concurrent.futures.Future, int] = {}
        for j, verdict in self._pool.run(tasks):
            i = owners[j]
            if verdict is RuleVerdict.CONFIRMED:
                rewards[i] = 1.0
                counters["rule_confirmed"] += 1
                continue
            if verdict is RuleVerdict.TIMED_OUT:
                counters["rule_timeouts"] += 1
            name = self._route[items[i].data_source]
            if name not in self._clients:
                rewards[i] = -1.0
                continue
            counters["verifier_calls"] += 1
            item = items[i]
            calls[self._threads.submit(
                self._clients[name].grade, item.question, item.gold_answer, tasks[j].text
            )] = i
        return calls

    def _settings_for(self, item: JudgeItem) -> MathJudgerSettings:
        try:
            return self._judgers[self._route[item.data_source]]
        except KeyError:
            raise ValueError(
                f"sample data_source {item.data_source!r} has no judger in data_judger_mapping"
                f" (have: {sorted(self._route)})"
            ) from None

    def live_workers(self) -> int:
        """Rule-check worker processes alive now (a per-step health counter; 0 before the first check)."""
        return self._pool.live_workers()

    def close(self) -> None:
        """Stop the worker processes and verifier threads."""
        self._pool.close()
        self._threads.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
