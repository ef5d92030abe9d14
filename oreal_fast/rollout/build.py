"""The one place that decides which rollout engine a run generates with, and how large it is.

Training, held-out validation and ``python -m oreal_fast.eval`` all call `build_rollout`, so an
evaluation samples through the same engine, with the same sizing rules, as validation in a run.
`sampling_params` turns the config's generation keys into `SamplingParams`, once per run.

Sizing (docs/rollout.md):
- the paged engine's KV pool: ``kv_cache_gib``, fixed; else first ``kv_cache_memory_fraction`` of
  the memory free now less what the optimisers will still allocate (AdamW's two fp32 moments per
  trained parameter appear at the first optimiser step, after the pool exists), and in training
  from then on what the measured steps leave (``engine.pool_sizing``, on CUDA);
- the plain sampler's batch: every session on CPU; on a GPU as many sessions as a share of the free
  memory holds at ``gen_max_length`` (its KV cache is one contiguous row per session, sized for
  the longest one): a quarter when an RL phase follows and needs the rest, most of it otherwise.
Invariant: nothing here runs a model; it only builds and sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from oreal_fast.config import ConfigError, TrainConfig
from oreal_fast.model.decoder import Decoder
from oreal_fast.progress import Progress
from oreal_fast.rollout.base import RolloutEngine, SamplingParams
from oreal_fast.rollout.engine import CudaMemory, EngineConfig, PagedEngine, PoolSizer, kv_cache_bytes
from oreal_fast.rollout.plain_sampler import PlainSampler

# Share of the free GPU memory the plain sampler's KV cache may take. In training the RL phase's
# activations reuse the rest after generation; an evaluation has nothing else to run.
PLAIN_KV_SHARE_TRAINING = 0.25
PLAIN_KV_SHARE_EVAL = 0.8


def sampling_params(cfg: TrainConfig, stop_token_id: int) -> SamplingParams:
    """The official generation settings of a config (reference 4.2)."""
    return SamplingParams(
        max_new_tokens=cfg.gen_max_new, max_length=cfg.gen_max_length, top_k=cfg.gen_top_k,
        top_p=cfg.gen_top_p, temperature=cfg.temperature, do_sample=cfg.gen_do_sample,
        stop_token_ids=(stop_token_id,))


def engine_name(cfg: TrainConfig, device: torch.device) -> str:
    """``rollout_engine``: ``auto`` is the paged engine on CUDA and the plain sampler elsewhere."""
    if cfg.rollout_engine != "auto":
        return cfg.rollout_engine
    return "paged" if device.type == "cuda" else "plain"


def build_rollout(cfg: TrainConfig, actor: Decoder, *, compute_dtype: torch.dtype, num_sessions: int,
                  optimizers: Sequence[torch.optim.Optimizer] = (), data_parallel: bool = False,
                  training: bool = True, progress: Progress | None = None) -> RolloutEngine:
    """The configured engine over ``actor``'s weights (see the module docstring).

    Args:
        cfg: ``rollout_engine`` and the sizing keys (``kv_cache_*``, ``kv_block_size``,
            ``max_num_seqs``, ``max_prefill_*``, ``cuda_graph``, ``rollout_keep_cache``,
            ``decode_steps_per_round``, ``overlap_decode_rounds``, ``gen_max_length``).
        actor: the model whose weights generate; the paged engine (and, under data parallelism,
            the plain sampler) copies them and takes later ones through ``sync_weights``.
        compute_dtype: the dtype generation computes in and the KV cache holds.
        num_sessions: the most sessions one ``generate`` call will hold.
        optimizers: the trained models' optimisers; their states still to come are kept out of the pool.
        data_parallel: the actor is sharded (FSDP2), so the plain sampler needs a whole copy.
        training: an RL phase follows each generation (the plain sampler then leaves it most of the
            memory; the paged engine's pool, unless ``kv_cache_gib`` fixes it, is resized from the
            steps' measured peaks).
        progress: where the engine counts finished responses and sampled tokens as it generates.

    Raises:
        ConfigError: a KV pool too small for one sequence of ``gen_max_length``, naming its key.
    """
    device = actor.embed.weight.device
    if engine_name(cfg, device) == "plain":
        share = PLAIN_KV_SHARE_TRAINING if training else PLAIN_KV_SHARE_EVAL
        batch = _plain_batch_size(actor, cfg.gen_max_length, compute_dtype, num_sessions, share)
        return PlainSampler(actor, max_batch_size=batch, compute_dtype=compute_dtype, own_copy=data_parallel,
                            progress=progress)
    reserve = sum(_adam_state_bytes(o) for o in optimizers)
    pool = kv_cache_bytes(device, gib=cfg.kv_cache_gib, memory_fraction=cfg.kv_cache_memory_fraction,
                          reserve_bytes=reserve)
    config = EngineConfig(
        max_model_len=cfg.gen_max_length, kv_cache_bytes=pool, block_size=cfg.kv_block_size,
        max_num_seqs=min(cfg.max_num_seqs, num_sessions), max_prefill_batch=cfg.max_prefill_batch,
        max_prefill_tokens=cfg.max_prefill_tokens, cuda_graph=cfg.cuda_graph, keep_cache=cfg.rollout_keep_cache,
        decode_steps_per_round=cfg.decode_steps_per_round, overlap_rounds=cfg.overlap_decode_rounds)
    try:
        return PagedEngine(actor, config, dtype=compute_dtype, sizer=pool_sizer(cfg, device, training),
                           progress=progress)
    except ValueError as e:
        key = "kv_cache_gib" if cfg.kv_cache_gib is not None else "kv_cache_memory_fraction"
        raise ConfigError(f"{key} in {cfg.config_path}: {e}") from e


def pool_sizer(cfg: TrainConfig, device: torch.device, training: bool) -> PoolSizer | None:
    """What resizes the paged engine's pool between steps: in training on CUDA, unless
    ``kv_cache_gib`` fixes the pool (an evaluation runs no steps to measure)."""
    if not training or cfg.kv_cache_gib is not None or device.type != "cuda":
        return None
    return PoolSizer(CudaMemory(device))


def _adam_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """AdamW's two fp32 moments per parameter, unless the first step has made them already."""
    if optimizer.state:
        return 0
    return sum(8 * p.numel() for group in optimizer.param_groups for p in group["params"])


def _plain_batch_size(actor: Decoder, max_length: int, compute_dtype: torch.dtype, num_sessions: int,
                      share: float) -> int:
    device = actor.embed.weight.device
    if device.type != "cuda":
        return num_sessions
    free, _ = torch.cuda.mem_get_info(device)
    per_session = actor.kv_bytes_per_token(compute_dtype) * max_length
    return max(1, min(num_sessions, int(share * free) // per_session))
