"""The paged engine's KV pool: its size at start (`kv_cache_bytes`), and sized from what a step
needs between steps (`PoolSizer`, when ``kv_cache_gib`` is unset).

The pool shares the GPU with everything else a step allocates: the models, their optimiser
states and, while the pool stays allocated (``rollout_keep_cache``), the RL phase's activations.
A fixed share of the memory free at start either leaves memory unused under the cap while the
pool preempts, or leaves the RL phase too little. The rule:

- until a step has been measured: the size the engine was built with (``kv_cache_memory_fraction``
  of the memory free at start, less the optimiser states still to come);
- after a step the trainer reports (``RolloutEngine.fit_memory``; it reports only steps that
  trained the actor, whose gradients and optimiser states exist): the step's need is its peak
  allocated memory besides the pool, over the phases the pool was allocated in (generation, and
  the RL phase with ``keep_cache``, its peak grown to a full micro-batch by the trainer:
  ``recompute.ActivationForecast``); the sizer keeps the largest need seen;
- target = limit - need - margin, within [the engine's minimum (one sequence of max_model_len),
  the most the engine can use (max_num_seqs sequences of max_model_len)]; limit is what this
  process's allocator may hold (the ``gpu_memory_limit_gib`` cap or the card, less what other
  processes hold); margin = max(1 GiB, 5 % of limit) covers the allocator's fragmentation (the
  peak counts allocated bytes, the cap reserved ones) and a later step that needs a little more;
- a resize frees the pool, allocates and zeroes the new one and recaptures the CUDA graphs (each
  batch bucket's eager step and capture, then each tail graph at its first use), so it happens
  only when it matters: shrink when the headroom limit - need - pool has fallen under half the
  margin (the pool would crowd the step), grow when the target is at least 10 % above the pool.

What it does not do: predict a step that needs far more than any before in what the trainer's
forecast does not cover; the margin absorbs growth between two steps, and an explicit
``kv_cache_gib`` fixes the pool.
Invariant: a pool the rule picks leaves at least half the margin free at the largest need seen,
unless the engine's minimum is larger.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import torch

GIB = 2**30
# margin = max(MARGIN_MIN_BYTES, MARGIN_SHARE x limit): 2 GiB under a 40 GiB cap, 7 GiB on a 141 GiB card
MARGIN_MIN_BYTES = GIB
MARGIN_SHARE = 0.05
# growth by less than GROW_SHARE x pool is not worth a reallocation
GROW_SHARE = 0.10


def pool_margin(limit_bytes: int) -> int:
    """Bytes left free beside the pool and the step's measured need."""
    return max(MARGIN_MIN_BYTES, int(MARGIN_SHARE * limit_bytes))


def next_pool_bytes(pool_bytes: int, need_bytes: int, limit_bytes: int, *, min_bytes: int, max_bytes: int) -> int:
    """The pool's size for the next steps (see the module docstring); ``pool_bytes`` when no resize is due.

    Args:
        pool_bytes: the pool now.
        need_bytes: the largest measured step need besides the pool.
        limit_bytes: what this process's allocator may hold.
        min_bytes, max_bytes: the smallest pool the engine accepts, the most it can use.
    """
    margin = pool_margin(limit_bytes)
    target = max(min_bytes, min(max_bytes, limit_bytes - need_bytes - margin))
    crowded = pool_bytes + need_bytes + margin // 2 > limit_bytes
    worth_growing = target - pool_bytes >= int(GROW_SHARE * pool_bytes)
    return target if (crowded and target < pool_bytes) or worth_growing else pool_bytes


class DeviceMemory(Protocol):
    def limit_bytes(self) -> int:
        """The most device memory this process's allocator may hold now."""
        ...


class CudaMemory:
    """`DeviceMemory` of one CUDA device: the per-process cap (``gpu_memory_limit_gib``, else the
    card), and no more than this process holds plus what is free on the device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def limit_bytes(self) -> int:
        index = self.index
        free, total = torch.cuda.mem_get_info(index)
        cap = int(torch.cuda.get_per_process_memory_fraction(index) * total)
        return min(cap, torch.cuda.memory_reserved(index) + free)


@dataclass
class PoolSizer:
    """`next_pool_bytes` over a run: keeps the largest need seen and reads the limit at each decision."""

    memory: DeviceMemory
    need_bytes: int = 0

    def next_bytes(self, pool_bytes: int, step_need_bytes: int, *, min_bytes: int, max_bytes: int) -> int:
        """The pool's next size after a step that needed ``step_need_bytes`` besides a pool of ``pool_bytes``."""
        self.need_bytes = max(self.need_bytes, step_need_bytes)
        return next_pool_bytes(pool_bytes, self.need_bytes, self.memory.limit_bytes(),
                               min_bytes=min_bytes, max_bytes=max_bytes)


def kv_cache_bytes(device: torch.device, *, gib: float | None, memory_fraction: float, reserve_bytes: int = 0) -> int:
    """Bytes for the KV pool at start: `gib` GiB when set, else `memory_fraction` of the memory free
    now (on CUDA what `CudaMemory` allows beyond what this process holds; available RAM on CPU)
    minus `reserve_bytes` (memory the caller will still allocate, e.g. optimiser states made at
    the first step)."""
    if gib is not None:
        return int(gib * GIB)
    if device.type == "cuda":
        memory = CudaMemory(device)
        free = memory.limit_bytes() - torch.cuda.memory_reserved(memory.index)
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(0, int(memory_fraction * (free - reserve_bytes)))
