"""The trained models' matmul weights cast to the compute dtype once per RL phase, not in every
forward, recompute and backward of every micro-batch.

Under autocast each ``F.linear`` casts its fp32 master weight (and bias) to the compute dtype in
every forward, and a recomputed block casts again in backward (checkpoint re-enters autocast in the
autograd thread, where the forward's autocast cache is gone); the LM-head kernels cast the head
matrix themselves. For the Qwen2.5-0.5B actor (494 M cast weights) that is ~2 GB of fp32 read and
~1 GB of bf16 written per forward, for every micro-batch of the step, and each recomputed block's
share of that again. `weights_cast_once` instead makes, when an RL phase starts (so after the previous
optimiser step), one compute-dtype LEAF copy of each tensor autocast would cast (`cast_targets`:
every ``nn.Linear``'s weight and bias; a tied LM head's matrix) and puts it in its module in place of
the master until the phase ends. Forwards, recomputes and backwards all read the copy: autocast's
cast of a tensor already in its dtype is no op, and so is the LM-head kernels' own cast (their dW
lands on the copy). The norms' weights and the embedding lookup read the fp32 masters, as they do
under autocast (neither is cast). Why a swap of module attributes for the phase: a call-scoped swap
(``torch.func.functional_call``) has ended when a recomputed block runs its forward again inside
``backward()``; a cached parametrization makes one cast node that every micro-batch's backward
would have to pass through again, and renames the state dict.

Gradients: a copy's gradient is the compute-dtype weight gradient of its GEMM (or of an LM-head
kernel), the tensor that autocast's cast-backward converts to fp32 for the master's accumulator. A
post-accumulate-grad hook on the copy does that conversion, adds it into the master's ``.grad`` and
frees the copy's. A tied LM head's matrix is also the embedding, whose lookup sends the master an
fp32 gradient of its own in the same backward; autocast sums the two in one autograd buffer before
``.grad`` takes them, so the head's gradient is held until the lookup's arrives (a hook on the
master) and enters ``.grad`` in that same sum. Every master's ``.grad`` is thus bit for bit what
autocast gives it, over any number of micro-batches (tests/test_cast_once.py).

Memory: the copies live for the phase only (generation between phases gets the memory back):
`cast_numel` elements in the compute dtype per trained model, 494 M (0.99 GB in bf16, the tied head's
136 M included) for the Qwen2.5-0.5B actor and 358 M (0.72 GB) for its token RM, 1.7 GB in all.
Autocast holds the casts a model's backward reads (those of the blocks not recomputed, and the LM
head's) while that model's graph is alive, one model at a time (the RM's backward ends before the
actor's forward): up to one model's cast weights, 0.99 GB for the actor with no block recomputed,
~0.3 GB (the head and one block) with every block recomputed. The phase's peak therefore grows by
the RM's copy (0.72 GB) with no recompute, by up to ~1.4 GB with full recompute.

Not here: data parallelism (FSDP2's mixed-precision policy already gathers the parameters in the
compute dtype, once per forward and once per backward of a block: the RL phase uses this only
without it), the frozen reference (loaded in the compute dtype: it has nothing to cast).
Invariant: outside the ``with``, every module holds its masters and no copy, hook or held gradient remains.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from oreal_fast.model.decoder import Decoder


def cast_targets(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(module, parameter name) of every fp32 tensor autocast casts for a matmul: each ``nn.Linear``'s
    weight and bias (a tied LM head, whose matrix is the embedding's, is handled apart: `_tied_heads`)."""
    return [(m, name) for m in model.modules() if isinstance(m, nn.Linear)
            for name, p in m.named_parameters(recurse=False) if p.dtype == torch.float32]


def _tied_heads(model: nn.Module) -> list[Decoder]:
    """The decoders in ``model`` whose fp32 embedding matrix is also their LM head."""
    return [m for m in model.modules() if isinstance(m, Decoder) and m.has_lm_head and m.lm_head is None
            and m.embed.weight.dtype == torch.float32]


def cast_numel(model: nn.Module) -> int:
    """Elements `weights_cast_once` copies for ``model`` (its memory cost is this x the dtype's bytes)."""
    linear = sum(getattr(m, name).numel() for m, name in cast_targets(model))
    return linear + sum(d.embed.weight.numel() for d in _tied_heads(model))


def _add_into(master: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """Post-accumulate hook of a copy: its gradient, in fp32, added into ``master.grad``; the copy's freed."""

    def hook(copy: torch.Tensor) -> None:
        if master.grad is None:
            master.grad = copy.grad.to(master.dtype)
        else:
            master.grad.add_(copy.grad)  # fp32 += bf16 adds the exact fp32 value of each bf16 element
        copy.grad = None

    return hook


def _hold_for(master: torch.Tensor, held: list[torch.Tensor]) -> Callable[[torch.Tensor], None]:
    """Post-accumulate hook of a tied head's copy: its gradient, in fp32, held for the lookup's."""

    def hook(copy: torch.Tensor) -> None:
        held.append(copy.grad.to(master.dtype))
        copy.grad = None

    return hook


def _with_held(held: list[torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hook of a tied head's master, run on the lookup's gradient before ``.grad`` takes it: the
    held head gradient added, the one sum autocast's autograd buffer forms."""
    return lambda grad: grad + held.pop() if held else grad


@contextlib.contextmanager
def weights_cast_once(models: list[nn.Module], dtype: torch.dtype) -> Iterator[None]:
    """Inside the ``with``, the models' matmuls read compute-dtype copies of their fp32 masters, made
    on entry; gradients reach the masters' ``.grad`` as under autocast (module docstring).

    Args:
        models: the trained models (fp32 masters, not sharded); each tensor of `cast_targets` and
            each tied LM head is copied once.
        dtype: the compute dtype (bf16 or fp16: the autocast dtype of the forwards).
    """
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    tied: list[tuple[Decoder, list[torch.Tensor]]] = []
    handles = []
    try:
        for model in models:
            for module, name in cast_targets(model):
                master = getattr(module, name)
                copy = nn.Parameter(master.detach().to(dtype), requires_grad=master.requires_grad)
                if master.requires_grad:
                    copy.register_post_accumulate_grad_hook(_add_into(master))
                swapped.append((module, name, master))
                setattr(module, name, copy)
            for decoder in _tied_heads(model):
                master, held = decoder.embed.weight, []
                copy = master.detach().to(dtype).requires_grad_(master.requires_grad)
                if master.requires_grad:
                    copy.register_post_accumulate_grad_hook(_hold_for(master, held))
                    handles.append(master.register_hook(_with_held(held)))
                tied.append((decoder, held))
                decoder.tied_head_cast = copy
        yield
        if any(held for _, held in tied):
            raise RuntimeError("weights_cast_once: a tied LM head's gradient never met its embedding's "
                               "(a backward through the head without the embedding lookup)")
    finally:
        for module, name, master in swapped:
            setattr(module, name, master)
        for decoder, _ in tied:
            decoder.tied_head_cast = None
        for handle in handles:
            handle.remove()
