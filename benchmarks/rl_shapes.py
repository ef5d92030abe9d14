"""Shared by the RL benchmarks: the Qwen2.5-0.5B shape, random-init models as the trainer holds them,
trajectory sets, and the FLOP count behind the MFU they report.

FLOPs of one RL phase, counted from every matmul (F = the trunk forward of `Decoder.estimate_flops`,
attention included; A = action tokens; the LM head costs 2 V H per scored token and pass):
  reference: F + 2AVH (forward only)
  token RM:  F + F (recompute) + 2F (backward; its 1-wide head is negligible)
  actor:     F + F (recompute) + 2F (backward) + 2AVH (logits) + 6AVH (logits recomputed, dH, dW)
  total:     9F + 10AVH
MFU = FLOPs / time / 790e12, the bf16 GEMM rate measured on an H200 (8192^3, random data).
"""

from __future__ import annotations

import torch

from oreal_fast.model.decoder import Decoder, DecoderConfig, TokenRewardModel, trunk_flops
from oreal_fast.recompute import apply_selective_recompute
from oreal_fast.runtime import RLModels
from oreal_fast.trajectories import Trajectory

QWEN25_05B = DecoderConfig(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6,
                           rope_theta=1000000.0, tie_embeddings=True, qkv_bias=True)
PEAK_FLOPS = 790e12
DEVICE = "cuda"


def decoder(dtype: torch.dtype, *, with_lm_head: bool = True, compute_dtype: torch.dtype = torch.bfloat16) -> Decoder:
    model = Decoder(QWEN25_05B, with_lm_head=with_lm_head, device=DEVICE, dtype=dtype, compute_dtype=compute_dtype)
    model.init_weights()
    return model


def rl_models(recompute: float = 1.0) -> RLModels:
    """Actor and token RM as fp32 masters computing in bf16, the frozen reference in bf16 (as the trainer)."""
    actor, reference = decoder(torch.float32), decoder(torch.bfloat16).requires_grad_(False).eval()
    token_rm = TokenRewardModel(decoder(torch.float32, with_lm_head=False))
    apply_selective_recompute(actor, recompute)
    apply_selective_recompute(token_rm.backbone, recompute)
    return RLModels(actor, reference, token_rm)


def trajectories(prompt_lens: list[int], response_lens: list[int], seed: int = 0) -> list[Trajectory]:
    """Random token ids; rewards alternate +1 / -1 (one correct, one incorrect per pair, as kept)."""
    gen = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, 151000, (n,), generator=gen).tolist()  # noqa: E731
    return [Trajectory(ids(p), ids(r), 1.0 if i % 2 == 0 else -1.0, 0.5 if i % 2 == 0 else -0.5)
            for i, (p, r) in enumerate(zip(prompt_lens, response_lens))]


def rl_phase_flops(kept: list[Trajectory], groups: list[range]) -> float:
    """9F + 10AVH summed over the micro-batches (each micro-batch's attention is within its sequences)."""
    c = QWEN25_05B
    total = 0.0
    for g in groups:
        total += 9 * trunk_flops(c, [kept[i].num_tokens for i in g])
        total += 10 * sum(kept[i].num_actions for i in g) * c.vocab_size * c.hidden_size
    return total


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
