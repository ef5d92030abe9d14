"""One step's samples, its phase clock and its metrics (reference 4.2-4.6, 5.1).

`StepSamples` holds, per sample in sample order (the k samples of a prompt contiguous), the prompt
record, prompt ids, response ids, decoded text, the engine's log-probs of the response tokens and,
once judged, the reward, plus the judger's counters. Each rank generates and judges its strided
share of the step's prompts; `gathered` makes the global record with one all-gather (rank order
keeps groups contiguous, reference 4.5 and 6), so every rank computes the same advantages,
filter and normalisers. The "infer" stage (4.6) builds the trajectories from it once the
advantages exist. `StepClock` times the step's phases and keeps the peak memory of the phases
that ask for it; `step_metrics` turns all of it into the official keys of 5.1, then ours (among
them the rollout check: |engine - trainer| log-prob over the kept response tokens).

Invariant: every per-sample list of a `StepSamples` has one entry per sample, in the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from oreal_fast.algo import ActorMetricSums, actor_metrics
from oreal_fast.data.prompts import PromptRecord
from oreal_fast.judge import JudgeItem
from oreal_fast.parallel import DataParallel, gather_lists
from oreal_fast.rl_step import MicroStepSums
from oreal_fast.trajectories import Trajectory


@dataclass
class StepSamples:
    """A step's samples in sample order; ``rewards`` and ``judge_counters`` once judged (4.3);
    ``response_logprobs`` ([len(response)] fp32 each) when the engine gives them
    (``RolloutEngine.response_logprobs``)."""

    records: list[PromptRecord]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    texts: list[str]
    rewards: list[float] = field(default_factory=list)
    judge_counters: dict[str, int] = field(default_factory=dict)
    response_logprobs: list[torch.Tensor] | None = None

    def judge_items(self) -> list[JudgeItem]:
        """What the judger reads of each sample, as in validation."""
        return [JudgeItem(question=r.question, response_text=text, gold_answer=r.gold_answer,
                          data_source=r.metadata["data_source"], record=dataclasses.asdict(r))
                for r, text in zip(self.records, self.texts)]

    def judged(self, rewards: list[float], counters: dict[str, int]) -> StepSamples:
        """This record with the judger's rewards (in sample order) and counters."""
        return dataclasses.replace(self, rewards=list(rewards), judge_counters=dict(counters))

    def gathered(self, dp: DataParallel) -> StepSamples:
        """All ranks' samples in rank order with the judger counters summed (4.5, 6), in one
        collective; a single process gets itself back."""
        if not dp.enabled:
            return self
        logprobs = self.response_logprobs or [None] * len(self.records)
        rows = list(zip(self.records, self.prompt_ids, self.response_ids, self.texts, self.rewards, logprobs))
        parts = gather_lists(dp, [(rows, self.judge_counters)])
        *columns, logprobs = [list(c) for c in zip(*(row for part_rows, _ in parts for row in part_rows))]
        counters: dict[str, int] = {}
        for _, part in parts:
            for key, value in part.items():
                counters[key] = counters.get(key, 0) + value
        return StepSamples(*columns, judge_counters=counters,
                           response_logprobs=None if self.response_logprobs is None else logprobs)

    def trajectories(self, advantages: list[float]) -> list[Trajectory]:
        """The "infer" stage (4.6): every sample's trajectory, with its reward and advantage (4.4)
        and the engine's log-probs."""
        logprobs = self.response_logprobs or [None] * len(self.response_ids)
        return [Trajectory(prompt_ids=p, response_ids=r, reward=reward, advantage=a, rollout_logprobs=lp)
                for p, r, reward, a, lp in zip(self.prompt_ids, self.response_ids, self.rewards, advantages, logprobs)]

    def num_tokens(self) -> int:
        """Prompt + response tokens of every sample."""
        return sum(len(p) + len(r) for p, r in zip(self.prompt_ids, self.response_ids))

    def num_new_tokens(self) -> int:
        """Response tokens of every sample."""
        return sum(len(r) for r in self.response_ids)


class StepClock:
    """Wall time of each phase of one step, and the peak memory (GiB) of the phases measured with
    ``memory=True``: allocated GPU memory, reset between those phases; on CPU the process's peak
    resident size so far (which only grows)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.peak_gib: dict[str, float] = {}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    @contextlib.contextmanager
    def phase(self, name: str, *, memory: bool = False) -> Iterator[None]:
        """Times what runs inside as phase ``name`` (and its peak memory if ``memory``)."""
        t0 = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - t0
        if memory:
            self._end_memory_phase(name)

    def _end_memory_phase(self, name: str) -> None:
        if self.device.type == "cuda":
            self.peak_gib[name] = torch.cuda.max_memory_allocated(self.device) / 2**30
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.peak_gib[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    def total(self) -> float:
        """Seconds since the step started."""
        return time.perf_counter() - self.start


def loss_metrics(sums: MicroStepSums | None) -> dict[str, float]:
    """The step's loss sums and the official averages over its action tokens, as host floats (the
    step's one host sync); all zero when no RL phase ran (Q8)."""
    if sums is None:
        sums = MicroStepSums(*([torch.zeros(())] * len(MicroStepSums._fields)))
    averages = actor_metrics(ActorMetricSums(sums.adv_sum, sums.neg_logprob_sum, sums.ref_kl_sum,
                                             sums.num_action_tokens))
    return {**{k: float(v) for k, v in sums._asdict().items()}, **{k: float(v) for k, v in averages.items()}}


def step_metrics(step: int, total_steps: int, samples: StepSamples, kept: list[Trajectory], losses: dict[str, float],
                 clock: StepClock, *, lrs: tuple[float, float], grad_norms: tuple[float, float],
                 world_size: int) -> dict:
    """The official keys of 5.1 in their order, every one global (reduced over ranks; memory and
    times are this rank's), then ours. ``lrs`` are the LRs applied (the frozen actor's is 0)."""
    t = clock.seconds
    per_gpu = 1 / world_size  # the *_tgs keys are per GPU, as the official per-rank ones
    num_rl_tokens = sum(traj.num_tokens for traj in kept)
    total_time = clock.total()
    return {
        "step": step + 1,
        "actor_lr": lrs[0],
        "actor_grad_norm": grad_norms[0],
        "token_level_rm_lr": lrs[1],
        "token_rm_grad_norm": grad_norms[1],
        "avg_judger_reward": sum(samples.rewards) / len(samples.rewards),
        **{k: losses[k] for k in ("avg_adv", "avg_gen_entropy", "avg_ref_kl", "positive_loss", "negative_loss",
                                  "kl_penalty_loss")},
        "rl_loss": losses["positive_loss"] + losses["negative_loss"] + losses["kl_penalty_loss"],
        "token_level_rm_loss": losses["token_level_rm_loss"],
        "max_memory": max(clock.peak_gib.values()),
        "avg_new_tokens": samples.num_new_tokens() / len(samples.response_ids),
        "num_rl_tokens": num_rl_tokens,
        # the infer stage builds the global list, so its rate is already one rank's
        "infer_tgs": int(samples.num_tokens() / max(t["infer"], 1e-9)),
        "rl_tgs": int(per_gpu * num_rl_tokens / max(t["rl"], 1e-9)),
        "gen_time": t["gen"],
        "infer_time": t["infer"],
        "rl_time": t["rl"],
        "total_time": total_time,
        "eta": int(total_time * (total_steps - step - 1)),
        # ours, after the official keys
        "num_kept": len(kept),
        "gen_tgs": int(per_gpu * samples.num_new_tokens() / max(t["gen"], 1e-9)),
        "judge_time": t["judge"],
        **{f"max_memory_{name}": gib for name, gib in clock.peak_gib.items()},
        **{f"judger_{k}": v for k, v in samples.judge_counters.items()},
        **rollout_logprob_metrics(losses),
    }


def rollout_logprob_metrics(losses: dict[str, float]) -> dict[str, float]:
    """Mean and max |engine - trainer| log-prob over the kept samples' response tokens (``rl_step``);
    none when no token was compared (an engine without log-probs, or no RL phase)."""
    tokens = losses["rollout_logprob_tokens"]
    if not tokens:
        return {}
    return {"rollout_logprob_abs_diff_mean": losses["rollout_logprob_abs_diff_sum"] / tokens,
            "rollout_logprob_abs_diff_max": losses["rollout_logprob_abs_diff_max"]}
