"""Activation recompute of whole decoder blocks: how many (a plan from the memory cap and the
micro-batch size, or the config's ratio), and the wrapping, applied to a model from outside (as FSDP
would be).

A recomputed block keeps only its input for the backward and runs its forward again there; the
others keep everything their backward reads. The official trainer recomputes every layer (xtuner's
``recompute_ratio`` 1.0), which costs a third more trunk FLOPs than none. ``selective_recompute``
set in the config is honoured as that ratio (the first ``round(ratio * num_layers)`` blocks);
None plans it: no block when one micro-batch's activations fit under the memory cap, otherwise the
fewest whole blocks that make them fit (``blocks_to_recompute``).

Activation bytes per token of one block (``block_activation_bytes``), with H the hidden size, Q and
K the q and k/v widths (heads x head_dim D), I the SwiGLU width, c the compute dtype's bytes (bf16: 2)
and r the residual stream's (the parameter dtype under autocast: 4 for fp32 masters):

    fused trunk ops (TRAIN_OPS):  2 r H          the two norms' inputs (block input, residual after attention)
                                + 2 c H          the two norms' outputs (kept once for q/k/v, once for gate/up)
                                + c (Q + 2 K)    rotated q, k and v (kept by attention)
                                + c Q + 4 heads  attention output (kept by attention and wo) and its fp32 logsumexp
                                + 3 c I          gate and up (kept by SwiGLU) and its output (kept by the down projection)
                                + 8              two fp32 rstd
    eager ops add:                2 r H          each norm's normalised row, kept by the weight's multiply
                                + 3 c H          autocast's casts of the fp32 norm outputs: one per projection
                                                 (q, k, v, gate, up), two of them counted above
                                + 4 c D          rope's cos and sin rows cast to the compute dtype, for q and for k
                                                 (its multiplies keep only the tables: they need no gradient)
                                + c I            silu(gate), kept by the multiply

Qwen2.5-0.5B (H 896, Q 896, K 128, D 64, I 4864) in bf16 over fp32 masters: 44.1 KB fused, 66.9 KB eager,
against 3.6 KB (r H) for a recomputed block's input. Not counted per block: the rope rows (8 x
head_dim bytes a token, once per forward) and GQA expansion (none where varlen attention takes GQA).

Invariant: parameter names and the state dict are unchanged (the wrapper strips its own prefix),
so checkpoints and the HF name map do not see it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper

from oreal_fast.cast_once import cast_numel
from oreal_fast.config import TrainConfig
from oreal_fast.model.decoder import Decoder, DecoderConfig
from oreal_fast.rollout.build import engine_name
from oreal_fast.rollout.engine import kv_cache_bytes
from oreal_fast.trajectories import Trajectory, plan_micro_batches

# Share of the memory cap the plan leaves free: allocator fragmentation (blocks freed between
# micro-batches of other sizes) and the transient buffers the plan does not itemise.
PLAN_MARGIN = 0.1
# The LM-head kernels' chunk in backward: linear_logprob's dz chunk (its _DZ_CHUNK_BYTES);
# fused_oreal_loss's fp32 logits chunk is 2048 rows of the vocabulary.
_DZ_CHUNK_BYTES = 128 * 2**20
_FUSED_CHUNK_ROWS = 2048


def block_activation_bytes(config: DecoderConfig, *, compute_bytes: int, residual_bytes: int,
                           fused_trunk: bool) -> int:
    """Bytes one block keeps for its backward per token when it is not recomputed (module docstring)."""
    H, I, c, r = config.hidden_size, config.intermediate_size, compute_bytes, residual_bytes
    Q, K = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    kept = 2 * r * H + 2 * c * H + c * (Q + 2 * K) + c * Q + 4 * config.num_heads + 3 * c * I + 8
    if not fused_trunk:
        kept += 2 * r * H + 3 * c * H + 4 * c * config.head_dim + c * I
    return kept


def blocks_to_recompute(num_layers: int, tokens: int, kept_bytes: int, input_bytes: int, budget_bytes: int) -> int:
    """The fewest whole blocks to recompute so that one micro-batch's activations fit the budget.

    With k of L blocks recomputed, the backward holds (L - k) blocks' activations, k blocks' inputs
    and one more block's worth (the block being recomputed, or the gradient buffers of the block
    whose backward runs): ``tokens * ((L - k) * kept + k * input + kept)`` bytes.

    Args:
        num_layers: L.
        tokens: the most tokens one micro-batch holds.
        kept_bytes: per token, a block that is not recomputed (``block_activation_bytes``).
        input_bytes: per token, a recomputed block's saved input.
        budget_bytes: the memory activations may take (may be negative: nothing fits).

    Returns:
        k in [0, L]; L when even that does not fit (recomputing every block is the most this can do).
    """
    for k in range(num_layers + 1):
        if tokens * ((num_layers - k) * kept_bytes + k * input_bytes + kept_bytes) <= budget_bytes:
            return k
    return num_layers


def micro_batch_tokens(micro_batch_size: int, token_budget: int, max_length: int) -> int:
    """The most tokens one RL micro-batch can hold (``trajectories.plan_micro_batches``): the token
    budget, or one trajectory of ``max_length`` above it; without a budget, ``micro_batch_size``
    trajectories of ``max_length``."""
    if token_budget > 0:
        return max(token_budget, max_length)
    return micro_batch_size * max_length


def activation_budget(cap_bytes: int, committed_bytes: int) -> int:
    """Bytes left to activations: the cap less `PLAN_MARGIN` of it and what the run holds anyway."""
    return int(cap_bytes * (1 - PLAN_MARGIN)) - committed_bytes


def recompute_count(num_layers: int, ratio: float | None, planned: int) -> int:
    """Blocks to wrap: ``round(ratio * num_layers)`` for a ratio set in the config, else the plan's count."""
    if ratio is None:
        return planned
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"selective_recompute must be None or in [0, 1], got {ratio}")
    return round(ratio * num_layers)


def apply_recompute(model: Decoder, num_blocks: int) -> int:
    """Wraps the first ``num_blocks`` blocks of ``model`` in place (for a token RM, pass its ``backbone``).

    Returns:
        The number of blocks wrapped.
    """
    if not 0 <= num_blocks <= len(model.blocks):
        raise ValueError(f"recompute: {num_blocks} blocks asked of a model with {len(model.blocks)}")
    for i in range(num_blocks):
        # preserve_rng_state=False as the official wrapper: the blocks have no dropout
        model.blocks[i] = checkpoint_wrapper(model.blocks[i], preserve_rng_state=False)
    return num_blocks


def committed_bytes(cfg: TrainConfig, trained: list[Decoder], *, compute_dtype: torch.dtype, tokens: int) -> int:
    """What a run holds during a trained model's backward besides the trunk's activations, estimated
    once the three models are loaded (before the optimisers' states and the rollout engine exist).

    The terms: the weights allocated now; each trained model's gradients (its parameter bytes) and
    AdamW's two moments (twice that); the compute-dtype casts of the largest trained model's weights,
    which autocast's matmuls keep for the backward, or with ``weights_cast_once`` every trained model's
    copies (`cast_once.cast_numel`: held through the phase; counted under torchrun too, where they are
    not made, so the plan errs towards recompute there); the LM head's backward (dW in the compute dtype,
    dH in fp32 for every token, plus linear_logprob's dz chunk, or fused_oreal_loss's fp32 logits
    chunk and fp32 dW accumulator); the paged engine's weight copy and, when it keeps its cache
    between generations, its KV pool (`kv_cache_bytes`, as `build_rollout` sizes it) and logits buffer.
    """
    device, c = trained[0].embed.weight.device, compute_dtype.itemsize
    param_bytes = [sum(p.numel() * p.element_size() for p in m.parameters()) for m in trained]
    num_params = max(sum(p.numel() for p in m.parameters()) for m in trained)
    config = trained[0].config
    VH = config.vocab_size * config.hidden_size
    head = VH * c + tokens * 4 * config.hidden_size
    head += _DZ_CHUNK_BYTES if cfg.loss_kernel == "linear_logprob" else _FUSED_CHUNK_ROWS * config.vocab_size * 4 + VH * 4
    casts = sum(cast_numel(m) for m in trained) if cfg.weights_cast_once else num_params
    total = torch.cuda.memory_allocated(device) + 3 * sum(param_bytes) + casts * c + head
    if engine_name(cfg, device) == "paged":
        total += num_params * c
        if cfg.rollout_keep_cache:
            total += kv_cache_bytes(device, gib=cfg.kv_cache_gib, memory_fraction=cfg.kv_cache_memory_fraction,
                                    reserve_bytes=2 * sum(param_bytes))
            total += cfg.max_num_seqs * config.vocab_size * c
    return total


def apply_recompute_plan(cfg: TrainConfig, trained: list[Decoder], compute_dtype: torch.dtype) -> str:
    """Wraps the blocks to recompute in each trained model (actor, token-RM backbone) and says how many.

    ``selective_recompute`` set in the config is that ratio. None: on CUDA the plan for one micro-batch
    of `micro_batch_tokens` under the process's memory cap (``gpu_memory_limit_gib``, else the GPU's
    memory) less `committed_bytes`; on CPU no block (host memory is not capped here).

    Returns:
        One line for the run's log: the blocks wrapped per model and where the number came from.
    """
    device = trained[0].embed.weight.device
    tokens = micro_batch_tokens(cfg.rl_mirco_batch, cfg.rl_micro_batch_tokens, cfg.gen_max_length)
    budget = None
    if cfg.selective_recompute is None and device.type == "cuda":
        cap = int(torch.cuda.get_per_process_memory_fraction(device) * torch.cuda.get_device_properties(device).total_memory)
        budget = activation_budget(cap, committed_bytes(cfg, trained, compute_dtype=compute_dtype, tokens=tokens))
    counts = []
    for model in trained:
        c = model.config
        planned = 0
        if budget is not None:
            kept = block_activation_bytes(c, compute_bytes=compute_dtype.itemsize,
                                          residual_bytes=model.embed.weight.element_size(),
                                          fused_trunk=model.ops.add_rms_norm is not None)
            planned = blocks_to_recompute(c.num_layers, tokens, kept, c.hidden_size * model.embed.weight.element_size(),
                                          budget)
        counts.append(apply_recompute(model, recompute_count(c.num_layers, cfg.selective_recompute, planned)))
    if cfg.selective_recompute is not None:
        source = f"selective_recompute = {cfg.selective_recompute}"
    elif budget is None:
        source = "planned: no memory cap on CPU"
    else:
        source = f"planned for {tokens} tokens a micro-batch, {budget / 2**30:.1f} GiB for activations"
    layers = [m.config.num_layers for m in trained]
    return "recompute: " + ", ".join(f"{n} of {L} blocks" for n, L in zip(counts, layers)) + f" ({source})"


def activation_bytes_per_token(model: Decoder, compute_dtype: torch.dtype) -> int:
    """Per token of a micro-batch, what ``model``'s backward holds under the recompute applied to it:
    ``blocks_to_recompute``'s sum with the wrapped count k, plus the LM head's fp32 dH (4 H)."""
    c, L = model.config, len(model.blocks)
    k = sum(isinstance(block, CheckpointWrapper) for block in model.blocks)
    residual = model.embed.weight.element_size()
    kept = block_activation_bytes(c, compute_bytes=compute_dtype.itemsize, residual_bytes=residual,
                                  fused_trunk=model.ops.add_rms_norm is not None)
    return (L - k) * kept + k * c.hidden_size * residual + kept + 4 * c.hidden_size


@dataclass(frozen=True)
class ActivationForecast:
    """A step's RL-phase peak grown to the largest micro-batch the config allows.

    The KV pool is sized from measured steps (``rollout.engine.pool_sizing``), and the first step
    that trains the actor may keep a few thousand tokens where a later one packs a micro-batch of
    ``rl_micro_batch_tokens``: sized from the small step alone, the pool would take the memory the
    later step's activations need (on an H100 under a 14 GiB cap, a first trained step of 576 kept
    tokens grew the pool from 4.3 to 8.2 GiB; a run whose first trained step kept 3353 tokens ran
    out of memory in the next step's RL phase). So the RL peak the pool is
    sized from is the measured one plus ``bytes_per_token`` for every token the step's largest
    micro-batch was short of ``max_tokens``.

    Attributes:
        bytes_per_token: the largest `activation_bytes_per_token` of the trained models (the token
            RM's backward ends before the actor's forward starts, so they do not add up).
        max_tokens: the most tokens one micro-batch can hold (`micro_batch_tokens`).
        micro_batch_size, token_budget: the config's micro-batch split (``plan_micro_batches``).
    """

    bytes_per_token: int
    max_tokens: int
    micro_batch_size: int
    token_budget: int

    @classmethod
    def for_models(cls, cfg: TrainConfig, trained: list[Decoder], compute_dtype: torch.dtype) -> ActivationForecast:
        return cls(max(activation_bytes_per_token(m, compute_dtype) for m in trained),
                   micro_batch_tokens(cfg.rl_mirco_batch, cfg.rl_micro_batch_tokens, cfg.gen_max_length),
                   cfg.rl_mirco_batch, cfg.rl_micro_batch_tokens)

    def peak_gib(self, peak_gib: Mapping[str, float], share: list[Trajectory]) -> dict[str, float]:
        """``peak_gib`` with its ``rl`` entry grown from the largest micro-batch this rank trained to
        ``max_tokens``; ``share``: the rank's kept trajectories (``DataParallel.share``), planned as
        ``rl_step.rl_phase`` plans them."""
        lengths = [t.num_tokens for t in share]
        groups = plan_micro_batches(lengths, self.micro_batch_size, self.token_budget)
        largest = max((sum(lengths[i] for i in g) for g in groups), default=0)
        growth = self.bytes_per_token * max(0, self.max_tokens - largest) / 2**30
        return {**peak_gib, "rl": peak_gib["rl"] + growth}
