"""Data parallelism for 1..N processes under ``torchrun``: the process group, FSDP2 applied from
outside the plain models (``parallelize``), and the step's few collectives as named functions.

One code path: a process started without ``torchrun`` is rank 0 of a world of 1 and every
collective here returns its input. ``parallelize`` is the sharding half of torchtitan's order
(``runtime.load_rl_models`` applies recompute first, then ``runtime.prepare_model`` this: ``fully_shard``
per block, then the root).
What this module does not do: decide what is gathered or split (the trainer and ``rl_step`` do),
or any tensor, sequence or pipeline parallelism.

Invariant: every loss a rank backpropagates is already divided by the step's *global* counts
(reference 4.7), so gradients are SUMmed over ranks, never averaged: FSDP2's own division by the
world size is switched off on every sharded module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel world (rank 0 of 1 without ``torchrun``)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run folder, its logs and checkpoints."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def strided(self, items: list[T]) -> list[T]:
        """Every ``world_size``-th item from this rank's index: how reference 3.4's sampler deals
        a step's prompts to ranks (the set of prompts of a step is the same for any world size)."""
        return items[self.rank::self.world_size]

    def share(self, items: list[T]) -> list[T]:
        """This rank's contiguous chunk of ``items``: chunk sizes differ by at most one, each item
        lands on exactly one rank (our fix of quirk Q3: nothing trained twice, nothing dropped)."""
        base, extra = divmod(len(items), self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return items[start:start + base + (self.rank < extra)]


def init_data_parallel() -> DataParallel:
    """Joins the ``torchrun`` process group (NCCL on CUDA, gloo on CPU) and picks the rank's GPU
    (``LOCAL_RANK``); without ``torchrun`` (no ``RANK`` in the environment) returns rank 0 of 1."""
    if "RANK" not in os.environ:
        return DataParallel()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return DataParallel(dist.get_rank(), dist.get_world_size(), local_rank)


def close_data_parallel() -> None:
    """Leaves the process group (a no-op without one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def parallelize(model: torch.nn.Module, blocks: torch.nn.ModuleList,
                mp_policy: MixedPrecisionPolicy) -> torch.nn.Module:
    """FSDP2 over the whole world: ``fully_shard`` on each of ``blocks``, then on ``model`` (its
    embedding, final norm and head gather as one unit with the root).

    ``mp_policy`` comes from the run's one compute dtype (``runtime.Precision.fsdp_policy``).
    Gradients are SUMmed (see the module invariant). A frozen model (no parameter requires grad)
    is sharded the same way: only its forwards gather.

    Args:
        model: a plain ``Decoder`` or ``TokenRewardModel``, recompute already applied.
        blocks: its decoder blocks (``model.blocks``, or ``model.backbone.blocks`` for the token RM).
        mp_policy: the dtypes parameters are gathered and gradients reduced in.

    Returns:
        ``model``, now an ``FSDPModule`` with DTensor parameters.
    """
    for block in blocks:
        fully_shard(block, mp_policy=mp_policy)
        _sum_gradients(block)
    fully_shard(model, mp_policy=mp_policy)
    _sum_gradients(model)
    return model


def _sum_gradients(module: Any) -> None:
    """Reduce-scatter as a plain SUM: divide factor 1 (the loss holds the global normalisers) and
    sum-only collectives (gloo has no PreMulSum; NCCL's zero-copy paths want SUM too). Both calls
    set one FSDP module's own groups only, hence once per sharded module."""
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded DTensor (a collective: every rank calls it), or ``t`` itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every sharded tensor gathered whole (a collective)."""
    return {name: full_tensor(t) for name, t in model.state_dict().items()}


def full_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, whole tensor)`` for each entry of ``model.state_dict()``, gathered one at a time as
    the caller iterates (a collective per sharded tensor: every rank iterates to the end), so the
    extra memory is one full tensor, not a second full model. What ``RolloutEngine.sync_weights`` takes."""
    for name, t in model.state_dict().items():
        yield name, full_tensor(t)


@torch.no_grad()
def load_weights(dst: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copies ``(name, tensor)`` pairs into ``dst``'s state-dict tensors in place, cast to their
    dtypes; every name of ``dst`` must come, and no other."""
    own = dst.state_dict()
    seen = set()
    for name, t in weights:
        if name not in own:
            raise KeyError(f"load_weights: {name!r} is not a weight of {type(dst).__name__}")
        own[name].copy_(t)
        seen.add(name)
    if len(seen) != len(own):
        raise KeyError(f"load_weights: {len(own) - len(seen)} weight(s) of {type(dst).__name__} not given, "
                       f"e.g. {sorted(set(own) - seen)[0]!r}")


def gather_lists(dp: DataParallel, items: list[T]) -> list[T]:
    """Every rank's list, concatenated in rank order (picklable items; reference 4.5's all-gather)."""
    if not dp.enabled:
        return items
    out: list[list[T] | None] = [None] * dp.world_size
    dist.all_gather_object(out, items)
    return [x for part in out for x in part]


def sum_over_ranks(dp: DataParallel, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The element-wise SUM over ranks of same-shaped tensors (one collective for all of them)."""
    if not dp.enabled:
        return tensors
    flat = torch.stack([t.reshape(()).to(torch.float64) for t in tensors])  # (n,) fp64: counts stay exact
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return [x.to(t.dtype) for x, t in zip(flat.unbind(), tensors)]


def max_over_ranks(dp: DataParallel, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The element-wise MAX over ranks of same-shaped tensors (one collective for all of them)."""
    if not dp.enabled:
        return tensors
    flat = torch.stack([t.reshape(()).to(torch.float64) for t in tensors])  # (n,)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    return [x.to(t.dtype) for x, t in zip(flat.unbind(), tensors)]


def broadcast_from_main(dp: DataParallel, value: T) -> T:
    """Rank 0's ``value`` on every rank (picklable; e.g. the run folder's name)."""
    if not dp.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]

