"""Selective recompute changes memory, not math: same loss, same gradients, same state-dict keys; the
plan's activation formula is what autograd saves, and the plan recomputes the fewest blocks that fit."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from oreal_fast.config import TrainConfig
from oreal_fast.data.packing import pack_sequences
from oreal_fast.kernels.trunk_train import TRAIN_OPS
from oreal_fast.model.attention import sdpa_attention
from oreal_fast.model.decoder import EAGER_OPS, Decoder, DecoderConfig
from oreal_fast.parallel import DataParallel
from oreal_fast.recompute import (PLAN_MARGIN, ActivationForecast, activation_budget, activation_bytes_per_token,
                                  apply_recompute, apply_recompute_plan, block_activation_bytes, blocks_to_recompute,
                                  micro_batch_tokens, recompute_count)
from oreal_fast.trajectories import Trajectory


def tiny_decoder() -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(family="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4,
                           num_heads=4, num_kv_heads=2, head_dim=8, tie_embeddings=True, qkv_bias=True)
    model = Decoder(config, attn_backend="sdpa")
    model.init_weights()
    return model


def loss_and_grads(model: Decoder) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    row = pack_sequences([[1, 5, 9, 2, 33], [7, 7, 3], [60, 4, 8, 12, 19, 1]])
    hidden = model(row.input_ids, row.positions, row.cu_seqlens, row.max_seqlen)
    loss = (hidden @ model.lm_head_weight.T).log_softmax(-1)[:, 3].sum()
    loss.backward()
    # the wrapper adds a level to parameter names (not to the state dict): compare on plain names
    return loss.detach(), {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
                           for n, p in model.named_parameters()}


@pytest.mark.parametrize("ratio,wrapped", [(1.0, 4), (0.5, 2), (0.0, 0)])
def test_recompute_keeps_loss_gradients_and_names(ratio, wrapped):
    plain = tiny_decoder()
    keys = list(plain.state_dict())
    loss0, grads0 = loss_and_grads(plain)
    model = tiny_decoder()
    assert apply_recompute(model, recompute_count(len(model.blocks), ratio, planned=0)) == wrapped
    assert list(model.state_dict()) == keys
    loss1, grads1 = loss_and_grads(model)
    assert torch.equal(loss0, loss1)
    assert grads1.keys() == grads0.keys()
    for name, g in grads0.items():
        torch.testing.assert_close(grads1[name], g, rtol=1e-6, atol=1e-7, msg=name)


def test_ratio_outside_unit_interval_is_refused():
    with pytest.raises(ValueError, match="selective_recompute"):
        recompute_count(4, 1.5, planned=0)


# ---------------------------------------------------------------------------------- the plan

class _FlashLikeAttention(torch.autograd.Function):
    """Causal attention that saves what a flash varlen kernel saves: q, k, v, out and an fp32
    logsumexp [heads, T] (the memory the plan counts; the math is the SDPA backend's)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host):
        out = sdpa_attention(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host)
        ctx.save_for_backward(q, k, v, out, torch.zeros(q.shape[1], q.shape[0]))
        return out

    @staticmethod
    def backward(ctx, dout):
        raise NotImplementedError("the plan's test only counts what the forward saves")


def _saved_bytes(model: Decoder, num_tokens: int) -> int:
    """Bytes of the distinct storages autograd saves in one forward under bf16 autocast."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    device = model.embed.weight.device
    row = pack_sequences([list(range(1, num_tokens // 2 + 1)), list(range(3, num_tokens - num_tokens // 2 + 3))])
    row = type(row)(row.input_ids.to(device), row.positions.to(device), row.cu_seqlens.to(device),
                    row.cu_seqlens_host)
    with torch.autocast(device.type, dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(row.input_ids, row.positions, row.cu_seqlens, row.max_seqlen)
    return sum(storages.values())


def _per_block_per_token(config: DecoderConfig, ops, device: str, lengths: tuple[int, int], backend=None) -> float:
    """Saved bytes per token and block: measured at two lengths and two depths, so the weights'
    casts and the per-forward tensors (embedding ids, rope rows, the final norm) cancel."""
    measured = {}
    for layers in (1, 3):
        model = Decoder(dataclasses.replace(config, num_layers=layers), device=device,
                        attn_backend="sdpa" if device == "cpu" else "auto", compute_dtype=torch.bfloat16,
                        trunk_ops=ops)
        model.init_weights()
        if backend is not None:
            for block in model.blocks:
                block.attn.backend = backend
        measured[layers] = [_saved_bytes(model, n) for n in lengths]
    grow = lengths[1] - lengths[0]
    return (measured[3][1] - measured[3][0] - measured[1][1] + measured[1][0]) / (2 * grow)


@pytest.mark.parametrize("fused", [False, True])
def test_block_activation_bytes_is_what_autograd_saves(fused):
    """The formula against the storages a forward saves (fp32 masters, bf16 autocast, an attention
    that saves what flash attention saves)."""
    if fused and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused trunk ops run on CPU only under TRITON_INTERPRET=1")
    config = DecoderConfig(family="qwen2", vocab_size=64, hidden_size=48, intermediate_size=80, num_layers=1,
                           num_heads=6, num_kv_heads=2, head_dim=8, tie_embeddings=True, qkv_bias=True)
    per_block = _per_block_per_token(config, TRAIN_OPS if fused else EAGER_OPS, "cpu", (16, 48),
                                     backend=_FlashLikeAttention.apply)
    assert per_block == block_activation_bytes(config, compute_bytes=2, residual_bytes=4, fused_trunk=fused)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen flash kernel needs CUDA")
@pytest.mark.parametrize("fused", [False, True])
def test_block_activation_bytes_on_gpu(fused):
    """The same at Qwen2.5-0.5B's block shape with torch's varlen flash attention on the GPU."""
    config = DecoderConfig(family="qwen2", vocab_size=1024, hidden_size=896, intermediate_size=4864, num_layers=1,
                           num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6, tie_embeddings=True,
                           qkv_bias=True)
    per_block = _per_block_per_token(config, TRAIN_OPS if fused else EAGER_OPS, "cuda", (1024, 3072))
    assert per_block == block_activation_bytes(config, compute_bytes=2, residual_bytes=4, fused_trunk=fused)


def test_no_block_is_recomputed_when_the_activations_fit():
    assert blocks_to_recompute(24, tokens=1000, kept_bytes=100, input_bytes=10, budget_bytes=25 * 100 * 1000) == 0


@pytest.mark.parametrize("budget", [10**6, 2 * 10**6, 17 * 10**5])
def test_the_fewest_blocks_that_fit_are_recomputed(budget):
    L, T, kept, inp = 24, 1000, 100, 10

    def need(k):  # (L - k) blocks kept, k inputs, one block's worth in flight
        return T * ((L - k) * kept + k * inp + kept)

    k = blocks_to_recompute(L, T, kept, inp, budget)
    assert 0 < k < L and need(k) <= budget < need(k - 1)


def test_every_block_is_recomputed_when_nothing_fits():
    assert blocks_to_recompute(24, tokens=1000, kept_bytes=100, input_bytes=10, budget_bytes=-5) == 24


def test_micro_batch_tokens():
    assert micro_batch_tokens(2, 32768, 16384) == 32768  # the budget
    assert micro_batch_tokens(2, 4096, 16384) == 16384  # one trajectory longer than the budget goes alone
    assert micro_batch_tokens(2, 0, 16384) == 2 * 16384  # the official split: 2 trajectories


def test_a_ratio_set_in_the_config_is_honoured():
    assert recompute_count(24, 1.0, planned=3) == 24
    assert recompute_count(24, 0.5, planned=3) == 12
    assert recompute_count(24, 0.0, planned=3) == 0
    assert recompute_count(24, None, planned=3) == 3
    with pytest.raises(ValueError, match="selective_recompute"):
        recompute_count(24, -0.1, planned=3)


def test_activation_budget_leaves_the_margin():
    assert activation_budget(1000, 300) == int(1000 * (1 - PLAN_MARGIN)) - 300


@pytest.mark.parametrize("ratio,wrapped", [(None, 0), (0.5, 2)])
def test_apply_recompute_plan_on_cpu(ratio, wrapped):
    """On CPU (no memory cap) the plan recomputes nothing; a configured ratio still applies."""
    cfg = TrainConfig(actor="x", datasets="none", selective_recompute=ratio)
    actor, rm = tiny_decoder(), tiny_decoder()
    line = apply_recompute_plan(cfg, [actor, rm], torch.float32)
    assert line.startswith(f"recompute: {wrapped} of 4 blocks, {wrapped} of 4 blocks")
    assert sum(isinstance(b, CheckpointWrapper) for b in actor.blocks) == wrapped


def test_activation_bytes_per_token_counts_the_wrapped_blocks():
    model = tiny_decoder()  # fp32: H 32, L 4
    kept = block_activation_bytes(model.config, compute_bytes=2, residual_bytes=4, fused_trunk=False)
    head = 4 * 32
    assert activation_bytes_per_token(model, torch.bfloat16) == 4 * kept + kept + head
    apply_recompute(model, 3)
    # three blocks keep their fp32 input (4 x 32 bytes), one keeps everything, one block's worth in flight
    assert activation_bytes_per_token(model, torch.bfloat16) == kept + 3 * 4 * 32 + kept + head


def _trajectory(length: int) -> Trajectory:
    return Trajectory([1] * 10, [2] * (length - 10), 1.0, 0.5)


def test_forecast_grows_the_rl_peak_to_a_full_micro_batch():
    forecast = ActivationForecast(bytes_per_token=2**20, max_tokens=4096, micro_batch_size=2, token_budget=4096)
    peaks = {"gen": 5.0, "rl": 6.0}
    # 600 tokens in one micro-batch: 3496 tokens short of a full one, at 1 MiB each
    assert forecast.peak_gib(peaks, [_trajectory(200), _trajectory(400)]) == {"gen": 5.0, "rl": 6.0 + 3496 / 1024}
    # packed 3000 + 1000 | 2500: the largest holds 4000 tokens
    grown = forecast.peak_gib(peaks, [_trajectory(3000), _trajectory(1000), _trajectory(2500)])
    assert grown["rl"] == 6.0 + 96 / 1024
    # a trajectory longer than the budget is a micro-batch of its own: nothing to grow
    assert forecast.peak_gib(peaks, [_trajectory(5000)])["rl"] == 6.0
    assert peaks == {"gen": 5.0, "rl": 6.0}  # the measured peaks are not changed


def test_forecast_grows_each_ranks_peak_from_the_micro_batches_it_trained():
    """With data parallelism a rank measures its peak on its own share of the kept list, so its
    growth counts from its own largest micro-batch, not the whole list's."""
    forecast = ActivationForecast(bytes_per_token=2**20, max_tokens=4096, micro_batch_size=2, token_budget=4096)
    kept = [_trajectory(3000), _trajectory(1000), _trajectory(300), _trajectory(200)]
    shares = [DataParallel(rank, 2).share(kept) for rank in range(2)]
    assert [t.num_tokens for t in shares[1]] == [300, 200]
    # rank 0 trained 3000 + 1000 tokens in one micro-batch, rank 1 only 500
    assert forecast.peak_gib({"rl": 6.0}, shares[0])["rl"] == 6.0 + 96 / 1024
    assert forecast.peak_gib({"rl": 6.0}, shares[1])["rl"] == 6.0 + 3596 / 1024


def test_forecast_for_models_reads_the_split_from_the_config():
    model = tiny_decoder()
    cfg = TrainConfig(actor="x", datasets="none", rl_micro_batch_tokens=0, rl_mirco_batch=3, gen_max_length=100)
    forecast = ActivationForecast.for_models(cfg, [model], torch.bfloat16)
    assert (forecast.max_tokens, forecast.micro_batch_size, forecast.token_budget) == (300, 3, 0)
    assert forecast.bytes_per_token == activation_bytes_per_token(model, torch.bfloat16)
    # three trajectories of 50 fill one micro-batch of sequences to 150 of its 300 tokens
    assert forecast.peak_gib({"rl": 1.0}, [_trajectory(50)] * 3)["rl"] == 1.0 + 150 * forecast.bytes_per_token / 2**30
