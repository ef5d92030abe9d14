"""Token-budget micro-batches: the plan covers the kept list in order within the budget, the
RL phase gives the official split's losses and gradients (fp64, CPU) whatever the split, and its
attention reads each micro-batch's sequence bounds from the host copy packed with it."""

from __future__ import annotations

from itertools import accumulate

import pytest
import torch

from oreal_fast.algo import global_normalisers
from oreal_fast.config import TrainConfig, load_config
from oreal_fast.model.attention import sdpa_attention
from oreal_fast.model.decoder import Decoder, DecoderConfig, TokenRewardModel
from oreal_fast.model.hf_io import load_decoder, load_token_rm
from oreal_fast.rl_step import RLSettings, rl_micro_step, rl_phase
from oreal_fast.runtime import Precision, RLModels
from oreal_fast.trajectories import (Trajectory, iter_micro_batches, make_micro_batch, make_micro_batches,
                                     plan_micro_batches)

from trainer_helpers import write_config


@pytest.mark.parametrize("lengths, budget, expected", [
    ([5, 5, 5, 5, 5], 10, [[0, 1], [2, 3], [4]]),
    ([3, 9, 2, 2, 20, 1], 10, [[0], [1], [2, 3], [4], [5]]),  # 20 > budget goes alone
    ([4, 4, 4], 100, [[0, 1, 2]]),
    ([7], 3, [[0]]),
    ([], 8, []),
])
def test_token_budget_plan(lengths, budget, expected):
    assert [list(g) for g in plan_micro_batches(lengths, 2, budget)] == expected


def test_zero_budget_is_the_official_split():
    assert [list(g) for g in plan_micro_batches([9, 1, 4, 4, 2], 2, 0)] == [[0, 1], [2, 3], [4]]


def test_micro_batches_packed_on_demand_equal_the_packed_list(monkeypatch):
    """iter_micro_batches packs a micro-batch only when asked for it, and gives make_micro_batches' tensors."""
    kept = _kept(7)
    plan = plan_micro_batches([t.num_tokens for t in kept], 2, 40)
    eager = make_micro_batches(kept, plan, torch.device("cpu"))
    packed = []
    monkeypatch.setattr("oreal_fast.trajectories.make_micro_batch",
                        lambda trajs, _make=make_micro_batch: packed.append(len(trajs)) or _make(trajs))
    lazy = iter_micro_batches(kept, plan, torch.device("cpu"))
    assert packed == []
    first = next(lazy)
    assert len(packed) == 1
    for a, b in zip([first, *lazy], eager, strict=True):
        for name in ("action_labels", "rewards", "advantages", "action_index", "action_seq", "action_cu_seqlens"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(a.row.input_ids, b.row.input_ids) and torch.equal(a.row.cu_seqlens, b.row.cu_seqlens)
    assert len(packed) == len(eager) > 1


def _kept(num: int) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(num):
        n_prompt, n_resp = (int(x) for x in torch.randint(3, 30, (2,), generator=gen))
        out.append(Trajectory(torch.randint(0, 259, (n_prompt,), generator=gen).tolist(),
                              torch.randint(0, 259, (n_resp,), generator=gen).tolist(),
                              reward=1.0 if i % 2 == 0 else -1.0, advantage=0.75 if i % 2 == 0 else -0.75))
    return out


def _phase(cfg, actor_dir, ref_dir, kept, micro_batch_size, budget):
    dev = torch.device("cpu")
    models = RLModels(load_decoder(actor_dir, dtype=torch.float64, device=dev),
                      load_decoder(ref_dir, dtype=torch.float64, device=dev),
                      load_token_rm(ref_dir, dtype=torch.float64, device=dev))
    with torch.no_grad():  # a non-zero RM head, so the token weights are not all equal
        models.token_rm.score_head.weight.copy_(torch.randn(1, 32, generator=torch.Generator().manual_seed(0)))
    sums = rl_phase(models, kept, RLSettings.from_config(cfg, Precision(dev, torch.float64)),
                    micro_batch_size=micro_batch_size, token_budget=budget, update_actor=True)
    grads = {f"actor.{n}": p.grad.clone() for n, p in models.actor.named_parameters()}
    grads.update({f"rm.{n}": p.grad.clone() for n, p in models.token_rm.named_parameters()})
    return {k: float(v) for k, v in sums._asdict().items()}, grads


def test_token_budget_gives_the_official_split_gradient(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file):
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file))
    kept = _kept(7)
    official, official_grads = _phase(cfg, perturbed_actor_dir, tiny_model_dir, kept, 2, 0)
    budget = sum(t.num_tokens for t in kept) // 3  # a different split: ~3 micro-batches of 1-4 sequences
    lengths = [t.num_tokens for t in kept]
    assert plan_micro_batches(lengths, 2, budget) != plan_micro_batches(lengths, 2, 0)
    packed, packed_grads = _phase(cfg, perturbed_actor_dir, tiny_model_dir, kept, 2, budget)
    assert official["positive_loss"] != 0 and official["kl_penalty_loss"] != 0
    for key, value in official.items():
        assert packed[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    for name, g in official_grads.items():
        assert (packed_grads[name] - g).abs().max() <= 1e-12 * max(1.0, g.abs().max()), name


class _NoHostReads(torch.Tensor):
    """A tensor whose values must not reach the host: on a GPU each of these reads is a sync."""

    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__int__,
             torch.Tensor.__index__, torch.Tensor.__float__, torch.Tensor.__bool__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.READS:
            raise AssertionError(f"cu_seqlens read on the host ({func.__name__})")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_attention_takes_the_micro_batch_bounds_from_the_host_not_from_cu_seqlens():
    """rl_micro_step hands every attention call of the reference, token RM and actor the bounds
    `make_micro_batch` packed (and `.to` kept on the host), so a backend that splits the row per
    sequence ("sdpa", "cudnn") never reads cu_seqlens back; here any host read of cu_seqlens raises,
    as a forward without the host bounds shows."""
    config = DecoderConfig(family="qwen2", vocab_size=272, hidden_size=32, intermediate_size=48, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, tie_embeddings=True)
    torch.manual_seed(0)
    actor, reference, backbone = (Decoder(config, attn_backend="sdpa", with_lm_head=head)
                                  for head in (True, True, False))
    for model in (actor, reference, backbone):
        model.init_weights()
    models = RLModels(actor, reference.requires_grad_(False), TokenRewardModel(backbone))
    seen = []

    def recording_sdpa(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host=None):
        seen.append(cu_seqlens_host)
        return sdpa_attention(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host)

    for model in (actor, reference, backbone):
        for block in model.blocks:
            block.attn.backend = recording_sdpa
    kept = _kept(4)
    batch = make_micro_batch(kept).to(torch.device("cpu"))
    batch.row.cu_seqlens = batch.row.cu_seqlens.as_subclass(_NoHostReads)
    settings = RLSettings.from_config(TrainConfig(actor="x", datasets="none", threshold_rescale=True),
                                      Precision(torch.device("cpu"), torch.float32))
    norm = global_normalisers(batch.action_cu_seqlens.diff(), batch.rewards)
    sums = rl_micro_step(models, batch, norm, settings, update_actor=True)
    assert torch.isfinite(torch.stack(list(sums))).all()
    bounds = tuple(accumulate((t.num_tokens for t in kept), initial=0))
    assert seen == [bounds] * 3 * config.num_layers  # reference, token RM and actor, every layer
    row = batch.row
    with pytest.raises(AssertionError, match="cu_seqlens read on the host"):
        actor(row.input_ids, row.positions, row.cu_seqlens, row.max_seqlen)
