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

What it does not: no tensors, no reward shaping; rewards go back as plain floats.

Invariant: `judge` returns exactly one reward in {+1.0, -1.0} per item, in input order, and
returns within bounded time (rule time limits + verifier timeouts and retries).
"""

import concurrent.futures
import dataclasses
import logging
import random

from oreal_fast.judge.pool import OFFICIAL_CHECK, STRICT_CHECK, RulePool, RuleTask, RuleVerdict
from oreal_fast.judge.settings import MathJudgerSettings, parse_judger_settings
from oreal_fast.judge.verifier import VerifierClient

RULE_CHECKS = {"official": OFFICIAL_CHECK, "strict": STRICT_CHECK}  # rule_mode -> check the workers run
COUNTER_KEYS = ("rule_confirmed", "verifier_calls", "verifier_failures", "rule_timeouts", "no_stop_word",
                "invalid_items")

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One sample to judge: the user question, the raw decoded response, the gold answer."""

    question: str
    response_text: str
    gold_answer: str
    data_source: str = "math"


@dataclasses.dataclass(frozen=True)
class JudgeOutcome:
    """rewards: one of +1.0 / -1.0 per item, input order; counters: COUNTER_KEYS -> count."""

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

    Raises:
        ValueError: no judger, a bad judger entry, or a mapping naming a judger that is not
            configured.
    """

    def __init__(self, judgers_config: dict, data_judger_mapping: dict) -> None:
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
        self._pool = RulePool(max(s.num_processes for s in self._judgers.values()))
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(s.max_concurrency for s in self._judgers.values()),
            thread_name_prefix="verifier",
        )

    def judge(self, items: list[JudgeItem]) -> JudgeOutcome:
        """Judge one step's samples concurrently.

        Raises:
            ValueError: an item whose data_source has no entry in data_judger_mapping.
        """
        counters = dict.fromkeys(COUNTER_KEYS, 0)
        rewards: list[float | None] = [None] * len(items)
        tasks, owners = self._rule_tasks(items, rewards, counters)
        calls = self._verifier_calls(items, tasks, owners, rewards, counters)
        for future, i in calls.items():
            grade = future.result()
            if grade is None:
                counters["verifier_failures"] += 1
            rewards[i] = 1.0 if grade else -1.0
        if counters["invalid_items"]:
            log.warning("judger: %d of %d item(s) scored -1 unjudged: a question, response or gold"
                        " answer that is not a string, or a blank gold answer",
                        counters["invalid_items"], len(items))
        return JudgeOutcome(rewards=[float(r) for r in rewards], counters=counters)

    def _rule_tasks(self, items: list[JudgeItem], rewards: list[float | None],
                    counters: dict[str, int]) -> tuple[list[RuleTask], list[int]]:
        """The rule check of every judgeable item that reached its stop word, and ``owners[j]``, the
        item of task j; the others get reward -1 here (counted)."""
        tasks, owners = [], []
        for i, item in enumerate(items):
            if not _judgeable(item):
                rewards[i] = -1.0
                counters["invalid_items"] += 1
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
