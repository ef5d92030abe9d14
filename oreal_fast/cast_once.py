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

Merged projections (``merge``, config ``merged_projections``): each ``Attention``'s wq, wk, wv masters
get ONE copy, stacked by rows ([(Hq + 2 Hkv) D, H], and one [(Hq + 2 Hkv) D] of their biases), and
each ``MLP``'s w_gate, w_up one [2I, H], in the module's ``merged_weight`` (``merged_bias``); the
decoder then runs q/k/v and gate/up as one GEMM each, q, k, v and gate, up being column views of its
output. Why: at 0.5B the k and v projections are 128 columns wide, GEMMs too skinny to run near the
GPU's rate, and each projection reads its input again in forward, recompute and backward; merged, x
is read once, and the input gradient is one GEMM instead of three (two) and the adds autograd makes
of them. A post-accumulate hook splits the copy's gradient by rows and adds each part, in fp32, into
its master's ``.grad``; o, down, the heads and everything else are copied as above. The masters,
their names, the state dict and so the checkpoint format are those without merging. Numerics: each
weight gradient row is the same sum over tokens as without merging, but the merged GEMM's input
gradient sums all its output columns in one fp32 accumulator where autograd adds three (two)
compute-dtype GEMM results, so what flows below it differs by compute-dtype round-off: equal to
tolerance, not bit for bit (tests/test_cast_once.py). Memory: the same elements as the
separate copies (`cast_numel`), so the same bytes.

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
Invariant: outside the ``with``, every module holds its masters, no ``merged_weight`` or ``merged_bias`` is
set, and no copy, hook or held gradient remains.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator

import torch
import torch.nn as nn

from oreal_fast.model.decoder import MLP, Attention, Decoder


def cast_targets(model: nn.Module, skip: Collection[nn.Module] = ()) -> list[tuple[nn.Module, str]]:
    """(module, parameter name) of every fp32 tensor autocast casts for a matmul: each ``nn.Linear``'s
    weight and bias (a tied LM head, whose matrix is the embedding's, is handled apart: `_tied_heads`),
    but those of the Linears in ``skip``."""
    return [(m, name) for m in model.modules() if isinstance(m, nn.Linear) and m not in skip
            for name, p in m.named_parameters(recurse=False) if p.dtype == torch.float32]


def merged_groups(model: nn.Module) -> list[tuple[Attention | MLP, list[nn.Linear]]]:
    """The projections one GEMM can serve, with fp32 masters: each ``Attention``'s wq, wk, wv and
    each ``MLP``'s w_gate, w_up, in the order of their rows in the merged matrix."""
    groups = []
    for m in model.modules():
        linears = [m.wq, m.wk, m.wv] if isinstance(m, Attention) else [m.w_gate, m.w_up] if isinstance(m, MLP) else []
        if linears and all(lin.weight.dtype == torch.float32 for lin in linears):
            groups.append((m, linears))
    return groups


def _tied_heads(model: nn.Module) -> list[Decoder]:
    """The decoders in ``model`` whose fp32 embedding matrix is also their LM head."""
    return [m for m in model.modules() if isinstance(m, Decoder) and m.has_lm_head and m.lm_head is None
            and m.embed.weight.dtype == torch.float32]


def cast_numel(model: nn.Module) -> int:
    """Elements `weights_cast_once` copies for ``model`` (its memory cost is this x the dtype's bytes)."""
    linear = sum(getattr(m, name).numel() for m, name in cast_targets(model))
    return linear + sum(d.embed.weight.numel() for d in _tied_heads(model))


def _add_into(masters: list[torch.Tensor]) -> Callable[[torch.Tensor], None]:
    """Post-accumulate hook of a copy of ``masters`` stacked by rows (of one master: a plain copy): each
    master's rows of its gradient added into that master's ``.grad`` in the master's dtype, as
    autocast's cast-backward would (fp32 += bf16 adds the exact fp32 value of each bf16 element);
    the copy's gradient freed."""
    sizes = [m.shape[0] for m in masters]

    def hook(copy: torch.Tensor) -> None:
        for master, grad in zip(masters, copy.grad.split(sizes)):
            if not master.requires_grad:
                continue
            if master.grad is None:
                master.grad = grad.to(master.dtype)
            else:
                master.grad.add_(grad)
        copy.grad = None

    return hook


def _merged_copy(masters: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """One compute-dtype leaf of the masters stacked by rows, written slice by slice (no fp32 temporary);
    its `_add_into` hook set when any master trains."""
    copy = torch.empty((sum(m.shape[0] for m in masters), *masters[0].shape[1:]), dtype=dtype,
                       device=masters[0].device)
    start = 0
    for m in masters:
        copy[start:start + m.shape[0]].copy_(m.detach())
        start += m.shape[0]
    if any(m.requires_grad for m in masters):
        copy.requires_grad_(True).register_post_accumulate_grad_hook(_add_into(masters))
    return copy


def _set_merged(groups: list[tuple[Attention | MLP, list[nn.Linear]]], dtype: torch.dtype,
                set_attrs: list[tuple[nn.Module, str]]) -> None:
    """Each group's merged copies in its module's ``merged_weight`` (and ``merged_bias`` when the
    projections have biases); each (module, attribute) set is appended to ``set_attrs``."""
    for module, linears in groups:
        for name in ("weight", "bias") if linears[0].bias is not None else ("weight",):
            setattr(module, f"merged_{name}", _merged_copy([getattr(lin, name) for lin in linears], dtype))
            set_attrs.append((module, f"merged_{name}"))


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
def weights_cast_once(models: list[nn.Module], dtype: torch.dtype, merge: bool = False) -> Iterator[None]:
    """Inside the ``with``, the models' matmuls read compute-dtype copies of their fp32 masters, made
    on entry; gradients reach the masters' ``.grad`` as under autocast (module docstring).

    Args:
        models: the trained models (fp32 masters, not sharded); each tensor of `cast_targets` and
            each tied LM head is copied once.
        dtype: the compute dtype (bf16 or fp16: the autocast dtype of the forwards).
        merge: each group of `merged_groups` gets one copy of its weights (and one of its biases),
            stacked by rows, in its module's ``merged_weight`` (``merged_bias``): q/k/v and gate/up
            run as one GEMM each (config ``merged_projections``).
    """
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    tied: list[tuple[Decoder, list[torch.Tensor]]] = []
    merged: list[tuple[nn.Module, str]] = []
    handles = []
    try:
        for model in models:
            groups = merged_groups(model) if merge else []
            _set_merged(groups, dtype, merged)
            for module, name in cast_targets(model, skip={lin for _, linears in groups for lin in linears}):
                master = getattr(module, name)
                copy = nn.Parameter(master.detach().to(dtype), requires_grad=master.requires_grad)
                if master.requires_grad:
                    copy.register_post_accumulate_grad_hook(_add_into([master]))
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
        for module, name in merged:
            setattr(module, name, None)
        for decoder, _ in tied:
            decoder.tied_head_cast = None
        for handle in handles:
            handle.remove()
