"""The RL phase of one whole step as the trainer's loop runs it: `rl_step.rl_phase` over all kept
trajectories, then clip + AdamW for the actor and the token RM (what the loop's `rl_time` covers),
at Qwen2.5-0.5B shape (random init; fp32 masters computing in bf16, reference in bf16).

Run: `pytest benchmarks/test_bench_rl_loop.py --benchmark-only` (CUDA only).
Providers:
  oreal_fast      micro-batches packed to the default token budget (rl_micro_batch_tokens 32768),
                  autocast casting the weights in every forward (weights_cast_once off)
  official_split  the official 2 sequences per micro-batch (rl_micro_batch_tokens 0)
  cast_once       oreal_fast with weights_cast_once (the weights cast once per phase; the recompute
                  plan counts the copies)
  merged          cast_once with merged_projections: q/k/v and gate/up as one GEMM each (the same
                  copy bytes, so the same recompute plan): the trainer's defaults
  merged_16k      merged with half the token budget (16384, the longest sequence's length): micro-batches
                  half as large, whose activations fit the cap with no block recomputed
  merged_varlen   merged with the flash varlen kernel for every row (attention_backend "varlen"; the
                  others but merged_runs run "auto", i.e. "by_length": cuDNN per sequence for a row whose
                  sequences all have 8192 tokens or more, varlen for the whole row otherwise)
  merged_runs     merged with attention_backend "by_length_runs": each run of consecutive sequences of
                  8192 tokens or more in a row to cuDNN, each run of shorter ones to one varlen call (the
                  mixed case's long sequences leave varlen; the short case makes the calls merged makes)
Cases (fixed seeds):
  short  64 kept sequences, 32 prompts x 2 samples, 470-token prompt + 150..220-token responses
         (~660 tokens each, the shape of a capped-response run)
  mixed  64 sequences with a long-tailed length mix 200 .. 16384 (most short, a few near the cap)
Models as the trainer builds them on CUDA: the fused trunk ops (`TRAIN_OPS`) and the recompute plan
for the largest micro-batch under the cap (32768 tokens for both splits at gen_max_length 16384;
16384 for merged_16k). The process is capped at 40 GiB (`torch.cuda.set_per_process_memory_fraction`)
for the whole case, so a case that needs more fails. extra_info: tokens_per_s, mfu and hfu (model and
hardware FLOPs, rl_shapes.py), recomputed_blocks, peak_gib (optimiser states included), num_micro_batches.
"""

from __future__ import annotations

import gc
import math

import pytest
import torch

from rl_shapes import CAP_GIB, DEVICE, PEAK_FLOPS, QWEN25_05B, mixed_case, rl_models, rl_phase_flops, short_case

from oreal_fast.config import TrainConfig
from oreal_fast.optimizers import clip_gradients
from oreal_fast.rl_step import RLSettings, rl_phase
from oreal_fast.runtime import Precision
from oreal_fast.trajectories import plan_micro_batches

# provider -> (rl_micro_batch_tokens, weights_cast_once, merged_projections, attention backend)
PROVIDERS = {"oreal_fast": (32768, False, False, "auto"), "official_split": (0, False, False, "auto"),
             "cast_once": (32768, True, False, "auto"), "merged": (32768, True, True, "auto"),
             "merged_16k": (16384, True, True, "auto"), "merged_varlen": (32768, True, True, "varlen"),
             "merged_runs": (32768, True, True, "by_length_runs")}


CASES = {"short": short_case, "mixed": mixed_case}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_rl_loop(benchmark, provider, case):
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP_GIB * 2**30 / total)
    try:
        kept = CASES[case]()
        budget, cast_once, merged, attn_backend = PROVIDERS[provider]
        # the plan for the largest micro-batch: the budget, or 2 sequences of 16384 for the official split
        models, recomputed = rl_models(tokens=budget or 32768, weights_cast_once=cast_once, attn_backend=attn_backend)
        actor_opt = torch.optim.AdamW(models.actor.parameters(), lr=1e-7, weight_decay=0.01, fused=True)
        rm_opt = torch.optim.AdamW(models.token_rm.parameters(), lr=1e-7, weight_decay=0.01, fused=True)
        cfg = TrainConfig(actor="random", datasets="none", threshold_rescale=True, weights_cast_once=cast_once,
                          merged_projections=merged)
        settings = RLSettings.from_config(cfg, Precision(torch.device(DEVICE), torch.bfloat16))

        def phase():
            rl_phase(models, kept, settings, micro_batch_size=2, token_budget=budget, update_actor=True)
            for model, opt in ((models.actor, actor_opt), (models.token_rm, rm_opt)):
                clip_gradients(model, 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()

        phase()  # warm-up: kernels compiled, optimiser states allocated
        torch.cuda.reset_peak_memory_stats()
        benchmark.pedantic(phase, rounds=2, iterations=1)
        median = benchmark.stats.stats.median
        groups = plan_micro_batches([t.num_tokens for t in kept], 2, budget)
        num_tokens = sum(t.num_tokens for t in kept)
        model_flops, hardware_flops = rl_phase_flops(kept, groups, recompute_share=recomputed / QWEN25_05B.num_layers,
                                                     logits_recompute=True)
        benchmark.extra_info.update(
            tokens_per_s=num_tokens / median,
            num_tokens=num_tokens,
            mfu=model_flops / median / PEAK_FLOPS,
            hfu=hardware_flops / median / PEAK_FLOPS,
            recomputed_blocks=recomputed,
            peak_gib=torch.cuda.max_memory_allocated() / 2**30,
            num_micro_batches=len(groups),
            max_micro_batch_tokens=max(sum(kept[i].num_tokens for i in g) for g in groups),
        )
        assert math.isfinite(median)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
