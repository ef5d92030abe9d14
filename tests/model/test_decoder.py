import math

import pytest
import torch

from oreal_fast.model import Decoder, DecoderConfig, TokenRewardModel, decoder_from_hf
from oreal_fast.model.attention import sdpa_attention
from oreal_fast.rollout.plain_sampler import ContiguousKVCache

LENS = [5, 11, 1, 7]


def packed(lens, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, vocab, (n,), generator=g) for n in lens]
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lens])
    return seqs, torch.cat(seqs), positions, cu


def ours_from(hf):
    return decoder_from_hf(hf.config, hf.state_dict(), dtype=torch.float32, device="cpu").eval()


@torch.no_grad()
def test_packed_row_matches_transformers_per_sequence(hf_model):
    ours = ours_from(hf_model)
    seqs, ids, pos, cu = packed(LENS, hf_model.config.vocab_size)
    hidden = ours(ids, pos, cu, max(LENS))
    logits = hidden @ ours.lm_head_weight.T
    for i, seq in enumerate(seqs):
        a, b = int(cu[i]), int(cu[i + 1])
        ref_hidden = hf_model.model(seq[None]).last_hidden_state[0]
        ref_logits = hf_model(seq[None]).logits[0]
        assert (hidden[a:b] - ref_hidden).abs().max() <= 1e-4
        assert (logits[a:b] - ref_logits).abs().max() <= 1e-4


def test_gradients_match_transformers(hf_model):
    ours = ours_from(hf_model)
    seqs, ids, pos, cu = packed(LENS, hf_model.config.vocab_size)
    w = torch.randn(sum(LENS), hf_model.config.vocab_size, generator=torch.Generator().manual_seed(3))
    (ours(ids, pos, cu, max(LENS)) @ ours.lm_head_weight.T * w).sum().backward()
    ref_logits = torch.cat([hf_model(s[None]).logits[0] for s in seqs])
    (ref_logits * w).sum().backward()
    theirs = dict(hf_model.named_parameters())
    pairs = [
        ("embed.weight", "model.embed_tokens.weight"),
        ("blocks.1.attn.wk.weight", "model.layers.1.self_attn.k_proj.weight"),
        ("blocks.0.mlp.w_gate.weight", "model.layers.0.mlp.gate_proj.weight"),
        ("blocks.0.attn_norm", "model.layers.0.input_layernorm.weight"),
    ]
    mine = dict(ours.named_parameters())
    for a, b in pairs:
        assert (mine[a].grad - theirs[b].grad).abs().max() <= 1e-4 * max(1.0, theirs[b].grad.abs().max().item()), a


@torch.no_grad()
def test_kv_cache_prefill_and_decode_match_full_forward(hf_model):
    ours = ours_from(hf_model)
    lens, prefix = [6, 9], [2, 4]  # prefill the prefixes, then feed the rest one token per step
    seqs, ids, pos, cu = packed(lens, hf_model.config.vocab_size)
    full = ours(ids, pos, cu, max(lens))
    cache = ContiguousKVCache(ours, num_rows=3, max_length=12, dtype=torch.float32)
    rows = torch.tensor([2, 0])  # cache rows need not follow packing order
    pre_ids = torch.cat([s[:p] for s, p in zip(seqs, prefix)])
    pre_pos = torch.cat([torch.arange(p) for p in prefix])
    pre_cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    got = [[h] for h in ours(pre_ids, pre_pos, pre_cu, 4, cache=cache.view(rows, pre_pos, pre_cu)).split(prefix)]
    for t in range(max(n - p for n, p in zip(lens, prefix))):
        live = [i for i in range(2) if prefix[i] + t < lens[i]]
        step_ids = torch.stack([seqs[i][prefix[i] + t] for i in live])
        step_pos = torch.tensor([prefix[i] + t for i in live])
        step_cu = torch.arange(len(live) + 1, dtype=torch.int32)
        h = ours(step_ids, step_pos, step_cu, 1, cache=cache.view(rows[live], step_pos, step_cu))
        for j, i in enumerate(live):
            got[i].append(h[j : j + 1])
    assert (torch.cat([torch.cat(g) for g in got]) - full).abs().max() <= 1e-5


def test_sdpa_backend_matches_dense_block_diagonal_attention():
    torch.manual_seed(0)
    T, Hq, Hkv, D = sum(LENS), 4, 2, 8
    q, k, v = torch.randn(T, Hq, D), torch.randn(T, Hkv, D), torch.randn(T, Hkv, D)
    _, _, _, cu = packed(LENS, 10)
    seq_of = torch.repeat_interleave(torch.arange(len(LENS)), torch.tensor(LENS))
    allowed = (seq_of[:, None] == seq_of[None, :]) & (torch.arange(T)[:, None] >= torch.arange(T)[None, :])
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # (T, Hq, D)
    scores = torch.einsum("thd,shd->hts", q, kk) / math.sqrt(D)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = torch.einsum("hts,shd->thd", probs, vv)
    assert (sdpa_attention(q, k, v, cu, max(LENS)) - expected).abs().max() <= 1e-5


TINY = DecoderConfig(family="qwen2", vocab_size=50, hidden_size=16, intermediate_size=24, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=4, qkv_bias=True, tie_embeddings=False, init_std=0.5)


def test_init_weights_from_meta_follows_its_table():
    torch.manual_seed(0)
    model = Decoder(TINY, device="meta")
    model.to_empty(device="cpu")
    model.init_weights()
    params = dict(model.named_parameters())
    assert all(torch.all(p == 1) for n, p in params.items() if n.endswith("norm"))
    assert all(torch.all(p == 0) for n, p in params.items() if n.endswith("bias"))
    assert params["embed.weight"].std().item() == pytest.approx(0.5, rel=0.1)
    assert params["lm_head.weight"].std().item() == pytest.approx(0.5, rel=0.1)


def test_num_params_counts_every_parameter_once():
    for tie in (False, True):
        cfg = DecoderConfig(**{**TINY.__dict__, "tie_embeddings": tie})
        assert cfg.num_params() == sum(p.numel() for p in Decoder(cfg, device="meta").parameters())


def test_costs_match_hand_count():
    model = Decoder(TINY, device="meta", dtype=torch.bfloat16)
    # K and V, 2 layers, 2 kv heads, head_dim 4, 2 bytes
    assert model.kv_bytes_per_token() == 2 * 2 * 2 * 4 * 2
    # per layer matmul weights: q 16x16, k,v 16x8 each, o 16x16, mlp 3 x 16x24 = 1920; 2 layers
    # attention: sequences of 3 and 2 tokens -> 6 + 3 = 9 causal pairs; 4 flops*D*heads*layers per pair
    assert model.estimate_flops([3, 2]) == 2 * 3840 * 5 + 4 * 4 * 4 * 2 * 9


@torch.no_grad()
def test_token_rm_scores_are_zero_then_one_dot_per_token():
    torch.manual_seed(0)
    backbone = Decoder(TINY, with_lm_head=False)
    backbone.init_weights()
    rm = TokenRewardModel(backbone)
    _, ids, pos, cu = packed(LENS, TINY.vocab_size)
    assert torch.equal(rm(ids, pos, cu, max(LENS)), torch.zeros(sum(LENS)))
    w = torch.randn(TINY.hidden_size)
    rm.score_head.weight.copy_(w[None])
    hidden = backbone(ids, pos, cu, max(LENS))
    expected = torch.stack([torch.dot(h, w) for h in hidden])
    assert torch.allclose(rm(ids, pos, cu, max(LENS)), expected, atol=1e-5)
    assert not any("lm_head" in n for n, _ in rm.named_parameters())


@pytest.mark.parametrize(
    "bad, message",
    [({"num_kv_heads": 3}, "num_kv_heads"), ({"family": "gpt2"}, "family"),
     ({"rope_scaling": {"rope_type": "yarn"}}, "yarn")],
)
def test_bad_config_names_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig(**{**TINY.__dict__, **bad})
