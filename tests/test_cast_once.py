"""Weights cast once per RL phase (`oreal_fast.cast_once`) against autocast's cast in every forward,
on CPU under bf16 autocast (which CPU autocast supports): fp32 masters, a bf16 reference, blocks
recomputed in both trained models.

The masters' gradients are compared BITWISE (torch.equal): both paths run the same bf16 GEMMs on the
same bf16 weights (a cast to bf16 rounds the same way wherever it runs), hand the masters the same
bf16 weight gradients converted to fp32, and add them into ``.grad`` in the same order, the tied LM
head's included (see the module docstring). So any difference is a wrong hook, not round-off.

With merged projections (``merge``, config ``merged_projections``) the gradients are compared to
those of separate projections within a tolerance, in fp32 and in bf16: its test says why and what
the largest difference is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oreal_fast.cast_once import cast_numel, cast_targets, weights_cast_once
from oreal_fast.config import TrainConfig
from oreal_fast.kernels.trunk_train import TRAIN_OPS
from oreal_fast.model.decoder import EAGER_OPS, MLP, Attention, Decoder, DecoderConfig, TokenRewardModel
from oreal_fast.parallel import DataParallel
from oreal_fast.recompute import apply_recompute
from oreal_fast.rl_step import RLSettings, rl_micro_step, rl_phase
from oreal_fast.runtime import Precision, RLModels
from oreal_fast.trajectories import Trajectory, make_micro_batch
from oreal_fast.algo import global_normalisers

CONFIG = DecoderConfig(family="qwen2", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=3,
                       num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=True, qkv_bias=True, init_std=0.1)
BF16 = Precision(torch.device("cpu"), torch.bfloat16)
ACTOR_RECOMPUTED, RM_RECOMPUTED = 2, 1


def _models(tied: bool = True, compute_dtype: torch.dtype = torch.bfloat16) -> RLModels:
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, tie_embeddings=tied)
    actor = Decoder(config, dtype=torch.float32, compute_dtype=compute_dtype)
    reference = Decoder(config, dtype=compute_dtype)
    backbone = Decoder(config, with_lm_head=False, dtype=torch.float32, compute_dtype=compute_dtype)
    for m in (actor, reference, backbone):
        m.init_weights()
    reference.requires_grad_(False).eval()
    token_rm = TokenRewardModel(backbone)
    with torch.no_grad():  # a non-zero score head, so the RM's weights shape the actor's loss
        token_rm.score_head.weight.normal_(0, 0.1)
    apply_recompute(actor, ACTOR_RECOMPUTED)
    apply_recompute(backbone, RM_RECOMPUTED)
    return RLModels(actor, reference, token_rm)


def _kept() -> list[Trajectory]:
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(0, CONFIG.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    return [Trajectory(ids(p), ids(r), 1.0 if i % 2 == 0 else -1.0, 0.4 if i % 2 == 0 else -0.4)
            for i, (p, r) in enumerate([(10, 20), (10, 15), (7, 30), (7, 9)])]


def _settings(cast_once: bool, loss_kernel: str = "linear_logprob", precision: Precision = BF16,
              merged: bool = False) -> RLSettings:
    cfg = TrainConfig(actor="x", datasets="none", threshold_rescale=True, weights_cast_once=cast_once,
                      loss_kernel=loss_kernel, merged_projections=merged)
    return RLSettings.from_config(cfg, precision)


def _grads(models: RLModels) -> dict[str, torch.Tensor]:
    grads = {f"actor.{n}": p.grad for n, p in models.actor.named_parameters()}
    grads.update({f"rm.{n}": p.grad for n, p in models.token_rm.named_parameters()})
    return grads


def _assert_bitwise(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert ref.keys() == got.keys()
    for name, g in ref.items():
        assert g is not None and g.dtype == torch.float32, name
        assert torch.equal(got[name], g), f"{name}: max |diff| {(got[name] - g).abs().max():.3e}"


@pytest.mark.parametrize("loss_kernel", ["linear_logprob", "fused_oreal_loss"])
@pytest.mark.parametrize("tied", [True, False])
def test_one_micro_step_gives_the_masters_autocasts_gradients_bitwise(tied, loss_kernel):
    """(a) One micro-batch, the context around it as `rl_phase` puts it."""
    batch = make_micro_batch(_kept()[:2])
    norm = global_normalisers(batch.action_cu_seqlens.diff(), batch.rewards)
    results = []
    for cast_once in (False, True):
        models, settings = _models(tied), _settings(cast_once, loss_kernel)
        with settings.weight_casts(models, DataParallel()):
            sums = rl_micro_step(models, batch, norm, settings, update_actor=True)
        results.append((torch.stack(list(sums)), _grads(models)))
    (ref_sums, ref_grads), (sums, grads) = results
    assert torch.equal(sums, ref_sums)
    _assert_bitwise(ref_grads, grads)


@pytest.mark.parametrize("tied", [True, False])
def test_a_phase_of_four_micro_batches_accumulates_the_same_gradients_bitwise(tied):
    """(b) Gradients accumulated over micro-batches: the tied matrix takes two gradients in each."""
    results = []
    for cast_once in (False, True):
        models = _models(tied)
        sums = rl_phase(models, _kept(), _settings(cast_once), micro_batch_size=1, token_budget=0, update_actor=True)
        results.append((torch.stack(list(sums)), _grads(models)))
    (ref_sums, ref_grads), (sums, grads) = results
    assert torch.equal(sums, ref_sums)
    _assert_bitwise(ref_grads, grads)


class _MasterCasts(TorchDispatchMode):
    """Counts the copies made of the given tensors' storage (autocast's casts reach ``aten._to_copy``)."""

    def __init__(self, masters: list[torch.Tensor]) -> None:
        super().__init__()
        self.ptrs, self.count = {p.data_ptr() for p in masters}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.ptrs:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_each_weight_is_cast_once_per_phase_not_per_forward_and_recompute():
    kept = _kept()
    counts = []
    for cast_once in (False, True):
        models = _models()
        with _MasterCasts([*models.actor.parameters(), *models.token_rm.parameters()]) as casts:
            rl_phase(models, kept, _settings(cast_once), micro_batch_size=1, token_budget=0, update_actor=True)
        counts.append(casts.count)
    models = _models()
    per_block = len(cast_targets(models.actor.blocks[0]))  # q, k, v with biases, o, gate, up, down: 10
    per_model = [len(cast_targets(models.actor)) + 1, len(cast_targets(models.token_rm))]  # + the tied head
    assert per_model == [3 * per_block + 1, 3 * per_block + 1]  # the RM's score head is a Linear
    # autocast: every forward casts each target, every recomputed block its own again
    per_micro_batch = sum(per_model) + (ACTOR_RECOMPUTED + RM_RECOMPUTED) * per_block
    assert counts == [len(kept) * per_micro_batch, sum(per_model)]


def test_the_modules_hold_their_masters_again_after_the_phase_and_after_an_error():
    models = _models()
    masters = dict(models.actor.named_parameters())
    with weights_cast_once([models.actor], torch.bfloat16):
        inside = dict(models.actor.named_parameters())
        assert inside.keys() == masters.keys()  # the parameters' names (and the state dict's) do not change
        block = models.actor.blocks[-1]  # not recomputed: no wrapper in the names
        assert block.attn.wq.weight.dtype == block.attn.wq.bias.dtype == block.mlp.w_down.weight.dtype == torch.bfloat16
        assert block.attn_norm is masters["blocks.2.attn_norm"]  # norms and the embedding keep their masters
        assert models.actor.lm_head_weight.dtype == torch.bfloat16 and inside["embed.weight"] is masters["embed.weight"]
    with pytest.raises(ValueError, match="boom"), weights_cast_once([models.actor], torch.bfloat16):
        raise ValueError("boom")
    after = dict(models.actor.named_parameters())
    assert all(after[n] is p for n, p in masters.items())
    assert models.actor.tied_head_cast is None and models.actor.lm_head_weight is masters["embed.weight"]


def test_a_tied_heads_gradient_that_never_meets_the_embeddings_is_an_error():
    models = _models()
    with pytest.raises(RuntimeError, match="never met its embedding"):
        with weights_cast_once([models.actor], torch.bfloat16):
            models.actor.lm_head_weight.float().square().sum().backward()


def test_the_phase_casts_nothing_under_data_parallelism_or_without_autocast():
    models = _models()
    assert isinstance(_settings(True).weight_casts(models, DataParallel(0, 2)), contextlib.nullcontext)
    fp32 = Precision(torch.device("cpu"), torch.float32)
    assert isinstance(_settings(True, precision=fp32).weight_casts(models, DataParallel()), contextlib.nullcontext)
    assert isinstance(_settings(False).weight_casts(models, DataParallel()), contextlib.nullcontext)


def test_cast_numel_counts_the_matmul_weights_and_the_tied_head():
    """Counted from the shapes by hand, and the docstring's Qwen2.5-0.5B numbers (on the meta device)."""
    c = CONFIG
    Q, K = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = c.hidden_size * (Q + 2 * K) + (Q + 2 * K) + Q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    models = _models()
    assert cast_numel(models.actor) == c.num_layers * per_layer + c.vocab_size * c.hidden_size
    assert cast_numel(models.token_rm) == c.num_layers * per_layer + c.hidden_size  # the score head, no LM head
    assert cast_numel(models.reference) == 0  # bf16 already
    qwen = DecoderConfig(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                         num_heads=14, num_kv_heads=2, head_dim=64, tie_embeddings=True, qkv_bias=True)
    actor = Decoder(qwen, device="meta", dtype=torch.float32, attn_backend="sdpa")
    backbone = Decoder(qwen, with_lm_head=False, device="meta", dtype=torch.float32, attn_backend="sdpa")
    assert round(cast_numel(actor) / 1e6) == 494 and round(cast_numel(backbone) / 1e6) == 358


# ---------------------------------------------------------------------------------- merged projections

FP32 = Precision(torch.device("cpu"), torch.float32)


def _phase(models: RLModels, merged: bool, compute_dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
    """Four micro-batches with the weights cast once, q/k/v and gate/up merged or not: under bf16
    autocast through the settings as the trainer runs it, or in fp32 (no autocast: the copies are
    made here, in fp32, so that only the merging differs)."""
    if compute_dtype == torch.bfloat16:
        sums = rl_phase(models, _kept(), _settings(True, merged=merged), micro_batch_size=1, token_budget=0,
                        update_actor=True)
    else:
        with weights_cast_once([models.actor, models.token_rm], torch.float32, merge=merged):
            sums = rl_phase(models, _kept(), _settings(False, precision=FP32), micro_batch_size=1, token_budget=0,
                            update_actor=True)
    return torch.stack(list(sums)), _grads(models)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("compute_dtype, sums_rtol, grads_rtol", [(torch.float32, 1e-6, 1e-5),
                                                                   (torch.bfloat16, 2e-3, 5e-2)])
def test_merged_projections_give_the_masters_the_gradients_of_separate_ones(tied, compute_dtype, sums_rtol,
                                                                             grads_rtol):
    """A phase of four micro-batches (blocks recomputed in both models, qkv biases) with and without
    merging; each master's gradient compared in relative L2 norm.

    The merged GEMM's input gradient sums all its output columns in one accumulator, where autograd
    adds the three (two) separate GEMMs' results, each rounded to the compute dtype; so the gradients
    below a merged GEMM differ by round-off. Measured here: in fp32 the loss sums are equal and the
    worst gradient is 1.0e-6 off (tolerance 1e-5); in bf16 the loss sums are equal too (the forward
    GEMMs give the same values) and the worst gradient is 1.6e-2 off (a k bias of a lower block;
    tolerance 5e-2). A gradient part dropped, counted twice or given to the wrong master is off by
    order one."""
    (ref_sums, ref_grads), (sums, grads) = (_phase(_models(tied, compute_dtype), merged, compute_dtype)
                                            for merged in (False, True))
    assert torch.allclose(sums, ref_sums, rtol=sums_rtol, atol=0), (sums, ref_sums)
    assert ref_grads.keys() == grads.keys()
    for name, ref in ref_grads.items():
        assert ref is not None and grads[name].dtype == torch.float32, name
        err = float((grads[name].double() - ref.double()).norm() / ref.double().norm())
        assert err <= grads_rtol, f"{name}: relative L2 difference {err:.2e}"


def _layout(model: torch.nn.Module) -> dict[str, tuple[torch.Size, torch.dtype]]:
    return {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}


def test_merged_copies_stand_in_for_the_projections_during_the_phase_only():
    """Inside: one bf16 copy per group, the masters' rows stacked in q, k, v (gate, up) order; the
    merged projections' own weights stay masters (not copied twice), the other Linears are copied;
    as many elements copied as without merging. Inside: the state dict's keys and shapes as before
    (the copied Linears' entries in bf16, as without merging). After (also after an error): keys,
    shapes and dtypes as before, no merged copy, every parameter its master."""
    models = _models()
    actor, c = models.actor, CONFIG
    masters, layout, numel = dict(actor.named_parameters()), _layout(actor), cast_numel(actor)
    attns = [m for m in actor.modules() if isinstance(m, Attention)]
    mlps = [m for m in actor.modules() if isinstance(m, MLP)]
    with weights_cast_once([actor], torch.bfloat16, merge=True):
        assert {k: shape for k, (shape, _) in _layout(actor).items()} == {k: s for k, (s, _) in layout.items()}
        Q, K = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        copied = actor.lm_head_weight.numel()
        for a in attns:
            assert a.merged_weight.dtype == torch.bfloat16 and a.merged_weight.shape == (Q + 2 * K, c.hidden_size)
            assert torch.equal(a.merged_weight, torch.cat((a.wq.weight, a.wk.weight, a.wv.weight)).bfloat16())
            assert torch.equal(a.merged_bias, torch.cat((a.wq.bias, a.wk.bias, a.wv.bias)).bfloat16())
            assert a.wk.weight.dtype == a.wk.bias.dtype == torch.float32 and a.wo.weight.dtype == torch.bfloat16
            copied += a.merged_weight.numel() + a.merged_bias.numel() + a.wo.weight.numel()
        for m in mlps:
            assert m.merged_weight.shape == (2 * c.intermediate_size, c.hidden_size)
            assert torch.equal(m.merged_weight, torch.cat((m.w_gate.weight, m.w_up.weight)).bfloat16())
            assert m.w_up.weight.dtype == torch.float32 and m.w_down.weight.dtype == torch.bfloat16
            copied += m.merged_weight.numel() + m.w_down.weight.numel()
        assert copied == numel
    with pytest.raises(ValueError, match="boom"), weights_cast_once([actor], torch.bfloat16, merge=True):
        raise ValueError("boom")
    assert _layout(actor) == layout
    assert all(p is masters[n] for n, p in actor.named_parameters())
    assert all(m.merged_weight is None for m in attns + mlps) and all(a.merged_bias is None for a in attns)


def test_after_a_merged_phase_the_models_train_as_before():
    """A merged phase, then a phase without cast_once on the same models (no optimiser step between):
    the masters' gradients equal those of models that never merged, bit for bit (no hook, copy or
    attribute of the merged phase is left to act)."""
    results = []
    for merged_first in (False, True):
        models = _models()
        if merged_first:
            rl_phase(models, _kept(), _settings(True, merged=True), micro_batch_size=2, token_budget=0,
                     update_actor=True)
            models.actor.zero_grad(set_to_none=True)
            models.token_rm.zero_grad(set_to_none=True)
        rl_phase(models, _kept(), _settings(False), micro_batch_size=2, token_budget=0, update_actor=True)
        results.append(_grads(models))
    _assert_bitwise(*results)


def test_merged_projections_need_weights_cast_once():
    with pytest.raises(ValueError, match="merged_projections needs weights_cast_once"):
        dataclasses.replace(_settings(True, merged=True), weights_cast_once=False)
    # from a config, the merge (on by default) follows weights_cast_once: off with it
    assert not _settings(False, merged=True).merged_projections


@pytest.mark.parametrize("fused", [False, True])
def test_a_merged_block_saves_no_more_for_its_backward(fused):
    """The storages one forward saves for its backward, merged against separate (both on the phase's
    copies): the same with the fused trunk ops (the gate|up output is the gate and up it replaces, and
    v, copied out of the q|k|v output, does not keep that output alive); with the eager ops, 3 bf16 [T, H]
    less per block (autocast casts the fp32 norm output once per GEMM: two GEMMs instead of five)."""
    if fused and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused trunk ops run on CPU only under TRITON_INTERPRET=1")
    T = 24
    saved = []
    for merged in (False, True):
        torch.manual_seed(0)
        model = Decoder(CONFIG, dtype=torch.float32, compute_dtype=torch.bfloat16,
                        trunk_ops=TRAIN_OPS if fused else EAGER_OPS)
        model.init_weights()
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with weights_cast_once([model], torch.bfloat16, merge=merged), torch.autocast("cpu", dtype=torch.bfloat16), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.arange(T), torch.arange(T), torch.tensor([0, T], dtype=torch.int32), T)
        saved.append(sum(storages.values()))
    fewer_casts = 0 if fused else CONFIG.num_layers * 3 * 2 * CONFIG.hidden_size * T
    assert saved[1] == saved[0] - fewer_casts
