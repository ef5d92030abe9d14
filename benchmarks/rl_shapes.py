"""Shared by the RL benchmarks: the Qwen2.5-0.5B shape, random-init models as the trainer holds them
(trunk ops and recompute plan included), trajectory sets (the `short` and `mixed` cases), and the
FLOP count behind the MFU they report.

FLOPs of one RL phase, summed over its micro-batches. Per micro-batch, F = F_mm + F_at is the trunk
forward (`trunk_flops`: 2 x matmul parameters per token, plus causal attention 4 x head_dim x heads
per (query, key) pair and layer), B = 2 F_mm + 2.5 F_at its backward (flash attention's backward
runs 5 matmuls to the forward's 2), A the action tokens and 2VH the LM head per token and pass:
  reference: F + 2AVH                           (forward only)
  token RM:  F + B                              (its 1-wide head is negligible)
  actor:     F + B + 2AVH (logits) + 4AVH (dH, dW)
  model FLOPs    = 3F + 2B + 8AVH: what the algorithm needs, whatever the implementation  -> "mfu"
  hardware FLOPs = model + 2rF (actor and RM recompute the share r of their blocks)
                   + 2AVH (linear_logprob recomputes the logits in backward; fused_oreal_loss does not) -> "hfu"
Per token with N_mm matmul parameters, short sequences (attention small) and full recompute this
is the design card's count: actor 2N + 2N_trunk + 4N, reference 2N, RM 8N_trunk.
MFU = model FLOPs / time / 790e12, the bf16 GEMM rate measured on an H200 (8192^3, random data);
HFU the same with the hardware FLOPs.
"""

from __future__ import annotations

import torch

import dataclasses
from collections.abc import Callable

from oreal_fast.algo import global_normalisers
from oreal_fast.config import TrainConfig
from oreal_fast.kernels.trunk_train import TRAIN_OPS
from oreal_fast.model.decoder import Decoder, DecoderConfig, TokenRewardModel, TrunkOps, trunk_flops
from oreal_fast.recompute import (activation_budget, apply_recompute, block_activation_bytes, blocks_to_recompute,
                                  committed_bytes)
from oreal_fast.parallel import DataParallel
from oreal_fast.rl_step import RLSettings, rl_micro_step
from oreal_fast.runtime import Precision, RLModels
from oreal_fast.trajectories import Trajectory, make_micro_batch

QWEN25_05B = DecoderConfig(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6,
                           rope_theta=1000000.0, tie_embeddings=True, qkv_bias=True)
PEAK_FLOPS = 790e12
DEVICE = "cuda"
CAP_GIB = 40.0
MICRO_PROMPT = 512
MICRO_CFG = TrainConfig(actor="random", datasets="none", threshold_rescale=True, pos_mult_adv=True)


def decoder(dtype: torch.dtype, *, with_lm_head: bool = True, compute_dtype: torch.dtype = torch.bfloat16,
            ops: TrunkOps = TRAIN_OPS, attn_backend: str = "auto") -> Decoder:
    model = Decoder(QWEN25_05B, attn_backend=attn_backend, with_lm_head=with_lm_head, device=DEVICE, dtype=dtype,
                    compute_dtype=compute_dtype, trunk_ops=ops)
    model.init_weights()
    return model


def planned_blocks(trained: list[Decoder], tokens: int, cap_gib: float = CAP_GIB,
                   loss_kernel: str = "linear_logprob", weights_cast_once: bool = False) -> int:
    """The trainer's recompute plan (`oreal_fast.recompute`) for micro-batches of `tokens` under
    `cap_gib`, for the RL phase alone (no rollout engine holds memory beside it)."""
    cfg = TrainConfig(actor="random", datasets="none", rollout_engine="plain", loss_kernel=loss_kernel,
                      weights_cast_once=weights_cast_once)
    budget = activation_budget(int(cap_gib * 2**30),
                               committed_bytes(cfg, trained, compute_dtype=torch.bfloat16, tokens=tokens))
    c = QWEN25_05B
    kept = block_activation_bytes(c, compute_bytes=2, residual_bytes=4,
                                  fused_trunk=trained[0].ops.add_rms_norm is not None)
    return blocks_to_recompute(c.num_layers, tokens, kept, 4 * c.hidden_size, budget)


def rl_models(recompute: int | None = None, *, ops: TrunkOps = TRAIN_OPS, tokens: int = 32768,
              loss_kernel: str = "linear_logprob", weights_cast_once: bool = False,
              attn_backend: str = "auto") -> tuple[RLModels, int]:
    """Actor and token RM as fp32 masters computing in bf16, the frozen reference in bf16 (as the trainer).

    Args:
        recompute: blocks recomputed in the actor and the RM; None = `planned_blocks` for `tokens`
            (with ``weights_cast_once``, the plan counts the weight copies).
        ops: the trunk ops of all three models.
        attn_backend: the attention backend of all three models (the config's ``attention_backend``).

    Returns:
        (the models, the blocks recomputed in each trained model).
    """
    actor = decoder(torch.float32, ops=ops, attn_backend=attn_backend)
    reference = decoder(torch.bfloat16, ops=ops, attn_backend=attn_backend).requires_grad_(False).eval()
    token_rm = TokenRewardModel(decoder(torch.float32, with_lm_head=False, ops=ops, attn_backend=attn_backend))
    if recompute is None:
        recompute = planned_blocks([actor, token_rm.backbone], tokens, loss_kernel=loss_kernel,
                                   weights_cast_once=weights_cast_once)
    apply_recompute(actor, recompute)
    apply_recompute(token_rm.backbone, recompute)
    return RLModels(actor, reference, token_rm), recompute


def trajectories(prompt_lens: list[int], response_lens: list[int], seed: int = 0) -> list[Trajectory]:
    """Random token ids; rewards alternate +1 / -1 (one correct, one incorrect per pair, as kept)."""
    gen = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, 151000, (n,), generator=gen).tolist()  # noqa: E731
    return [Trajectory(ids(p), ids(r), 1.0 if i % 2 == 0 else -1.0, 0.5 if i % 2 == 0 else -0.5)
            for i, (p, r) in enumerate(zip(prompt_lens, response_lens))]


def rl_phase_flops(kept: list[Trajectory], groups: list[range], *, recompute_share: float,
                   logits_recompute: bool) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of the RL phase over the micro-batches ``groups`` (module docstring).

    Args:
        recompute_share: r, the share of trunk blocks the actor and the RM recompute.
        logits_recompute: the actor's LM head computes the logits again in backward (linear_logprob).
    """
    c = QWEN25_05B
    model = hardware = 0.0
    for g in groups:
        lens = [kept[i].num_tokens for i in g]
        F = trunk_flops(c, lens)
        F_at = 4 * c.head_dim * c.num_heads * c.num_layers * sum(n * (n + 1) // 2 for n in lens)
        B = 2 * (F - F_at) + 2.5 * F_at
        head = 2 * sum(kept[i].num_actions for i in g) * c.vocab_size * c.hidden_size  # 2AVH
        flops = 3 * F + 2 * B + 4 * head
        model += flops
        hardware += flops + 2 * recompute_share * F + (head if logits_recompute else 0)
    return model, hardware


def short_case() -> list[Trajectory]:
    """64 kept sequences, 32 prompts x 2 samples, 470-token prompts + 150..220-token responses."""
    gen = torch.Generator().manual_seed(1)
    responses = torch.randint(150, 221, (64,), generator=gen).tolist()
    kept = trajectories([470] * 64, responses, seed=1)
    for i in range(1, 64, 2):
        kept[i].prompt_ids = kept[i - 1].prompt_ids  # two samples of each prompt
    return kept


def mixed_case() -> list[Trajectory]:
    """64 sequences with a long-tailed length mix 200 .. 16384 (most short, a few near the cap)."""
    gen = torch.Generator().manual_seed(2)
    u = torch.rand(64, generator=gen).tolist()
    totals = [int(200 * (16384 / 200) ** (x**3)) for x in u]  # long tail: median ~ 300, max ~ 16k
    prompts = [min(470, t // 2) for t in totals]
    return trajectories(prompts, [t - p for t, p in zip(totals, prompts)], seed=2)


def micro_batch_trajectories(length: int) -> list[Trajectory]:
    """The official micro-batch: two samples of one 512-token prompt, each `length` tokens in all."""
    kept = trajectories([MICRO_PROMPT, MICRO_PROMPT], [length - MICRO_PROMPT] * 2)
    kept[1].prompt_ids = kept[0].prompt_ids
    return kept


def micro_batch_step(length: int, *, impl: str = "triton", loss_kernel: str = "linear_logprob",
                     ops: TrunkOps = TRAIN_OPS, recompute: int | None = None, weights_cast_once: bool = True,
                     merged_projections: bool = True, attn_backend: str = "auto") -> tuple[Callable[[], None], int]:
    """(step, blocks recomputed): step runs the whole RL phase of `micro_batch_trajectories(length)`
    (reference forward, token-RM and actor forward + backward) as rl_phase runs a micro-batch,
    gradients dropped after it; the defaults are the trainer's."""
    models, recomputed = rl_models(recompute, ops=ops, tokens=2 * length, loss_kernel=loss_kernel,
                                   weights_cast_once=weights_cast_once, attn_backend=attn_backend)
    batch = make_micro_batch(micro_batch_trajectories(length)).to(torch.device(DEVICE))
    norm = global_normalisers(batch.action_cu_seqlens.diff(), batch.rewards)
    cfg = dataclasses.replace(MICRO_CFG, loss_impl=impl, loss_kernel=loss_kernel,
                              weights_cast_once=weights_cast_once, merged_projections=merged_projections)
    settings = RLSettings.from_config(cfg, Precision(torch.device(DEVICE), torch.bfloat16))

    def step():
        with settings.weight_casts(models, DataParallel()):  # as rl_phase runs its micro-batches
            rl_micro_step(models, batch, norm, settings, update_actor=True)
        models.actor.zero_grad(set_to_none=True)
        models.token_rm.zero_grad(set_to_none=True)
    return step, recomputed
