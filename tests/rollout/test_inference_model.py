"""The engine's inference model against the trained Decoder: weight packing by `load_weights`, and
the logits of a prefill and of decode steps through the model runner's paged caches.

CPU, fp32: the eager ops always; the Triton kernels under TRITON_INTERPRET=1. The packed GEMMs
sum in another order than the Decoder's separate ones, so logits agree to fp32 round-off through
two layers (1e-5 of their scale), not bit for bit; a wrong packing, slot or position errs by
order 1.
"""

import os

import pytest
import torch

from oreal_fast.model.attention import sdpa_attention
from oreal_fast.model.decoder import Decoder, DecoderConfig
from oreal_fast.parallel import full_weights
from oreal_fast.rollout.engine.inference_model import InferenceModel
from oreal_fast.rollout.engine.model_runner import DecodeCache, PrefillCache

CONFIGS = {
    "qwen2": DecoderConfig(family="qwen2", vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e4, qkv_bias=True,
                           tie_embeddings=True, init_std=0.2),
    "llama": DecoderConfig(family="llama", vocab_size=89, hidden_size=48, intermediate_size=80, num_layers=2,
                           num_heads=3, num_kv_heads=1, head_dim=16, rope_theta=5e5, out_bias=True, init_std=0.2),
}


def decoder(config: DecoderConfig) -> Decoder:
    """Random weights, norms and biases included, so that every weight moves the logits."""
    torch.manual_seed(0)
    m = Decoder(config, attn_backend="sdpa", dtype=torch.float32)
    m.init_weights()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm") or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return m.requires_grad_(False).eval()


def inference_copy(m: Decoder, impl: str = "eager", gemv_max_tokens: int = 0,
                   skinny_max_tokens: int = 0) -> InferenceModel:
    copy = InferenceModel(m.config, device="cpu", dtype=torch.float32, impl=impl, gemv_max_tokens=gemv_max_tokens,
                          skinny_max_tokens=skinny_max_tokens)
    copy.load_weights(full_weights(m))
    return copy


@pytest.mark.parametrize("name", CONFIGS)
def test_load_weights_packs_the_decoder_weights_in_place(name):
    m = decoder(CONFIGS[name])
    copy = InferenceModel(m.config, device="cpu", dtype=torch.float32, impl="eager")
    before = {n: t.data_ptr() for n, t in copy.state_dict().items()}
    copy.load_weights(full_weights(m))
    assert {n: t.data_ptr() for n, t in copy.state_dict().items()} == before
    ours = m.state_dict()
    for i, layer in enumerate(copy.layers):
        p = f"blocks.{i}."
        wq, wk, wv = (ours[f"{p}attn.{w}.weight"] for w in ("wq", "wk", "wv"))
        assert torch.equal(layer.attn.qkv.weight, torch.cat([wq, wk, wv]))
        if m.config.qkv_bias:
            assert torch.equal(layer.attn.qkv.bias, torch.cat([ours[f"{p}attn.{w}.bias"] for w in ("wq", "wk", "wv")]))
        gate_up = torch.cat([ours[p + "mlp.w_gate.weight"], ours[p + "mlp.w_up.weight"]])
        assert torch.equal(layer.mlp.gate_up.weight, gate_up)
    views = copy.decoder_views()
    assert sorted(views) == sorted(ours)
    assert all(torch.equal(views[n], ours[n]) for n in ours)


def test_load_weights_names_what_is_wrong():
    m = decoder(CONFIGS["qwen2"])
    copy = InferenceModel(m.config, device="cpu", dtype=torch.float32, impl="eager")
    weights = dict(full_weights(m))
    with pytest.raises(KeyError, match="'blocks.0.attn.wq.scale' is not a weight"):
        copy.load_weights([*weights.items(), ("blocks.0.attn.wq.scale", torch.ones(1))])
    with pytest.raises(KeyError, match="1 Decoder weight.* not given, e.g. 'blocks.1.mlp.w_up.weight'"):
        copy.load_weights([(n, t) for n, t in weights.items() if n != "blocks.1.mlp.w_up.weight"])
    with pytest.raises(ValueError, match=r"'blocks.0.attn.wk.weight' has shape \(32, 63\)"):
        copy.load_weights([(n, t[:, :63] if n == "blocks.0.attn.wk.weight" else t) for n, t in weights.items()])


def _impls():
    """(impl, gemv_max_tokens, skinny_max_tokens): the few-token GEMV layers (Triton only) for the
    decode steps of 2 tokens alone (2, 0), or for the prefill of 14 tokens too (16, 0); the
    skinny-GEMM layers for the prefill and the decode steps (0, 16), or for the prefill beside GEMV
    decode steps (2, 16)."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    needs = pytest.mark.skipif(not interpret, reason="needs TRITON_INTERPRET=1")
    return [("eager", 0, 0), *(pytest.param("triton", g, s, marks=needs, id=f"triton-gemv{g}-skinny{s}")
                               for g, s in ((0, 0), (2, 0), (16, 0), (0, 16), (2, 16)))]


@pytest.mark.parametrize("impl, gemv_max_tokens, skinny_max_tokens", _impls())
@pytest.mark.parametrize("name", CONFIGS)
def test_prefill_then_decode_gives_the_decoders_logits(name, impl, gemv_max_tokens, skinny_max_tokens):
    """Two sequences (prompts of 5 and 9 tokens) prefilled in one packed forward, then 6 decode
    steps fed a fixed continuation, in a pool of blocks of 4 given out in scrambled order; each
    step's logits against the Decoder's plain causal forward over the whole sequences."""
    m = decoder(CONFIGS[name])
    c, copy = m.config, inference_copy(m, impl, gemv_max_tokens, skinny_max_tokens)
    assert copy.layer_path(2) == ("plain" if impl == "eager" else
                                  "gemv" if gemv_max_tokens >= 2 else "skinny" if skinny_max_tokens >= 2 else "plain")
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, c.vocab_size, (n,), generator=g) for n in (5 + 6, 9 + 6)]
    prompt_lens, steps, bs = [5, 9], 6, 4
    kv = torch.zeros(c.num_layers, 2, 12, bs, c.num_kv_heads, c.head_dim)
    tables = torch.tensor([[7, 2, 9, 4], [1, 11, 5, 8]], dtype=torch.int32)  # block 0 stays unused

    def slots(row, positions):
        return tables[row, positions // bs].long() * bs + positions % bs

    with torch.no_grad():
        full = [m(s, torch.arange(len(s)), torch.tensor([0, len(s)], dtype=torch.int32), len(s),
                  head=lambda h, w: h @ w.T) for s in seqs]
        ids = torch.cat([s[:n] for s, n in zip(seqs, prompt_lens)])
        pos = torch.cat([torch.arange(n) for n in prompt_lens])
        cu = torch.tensor([0, 5, 14], dtype=torch.int32)
        cache = PrefillCache(kv, torch.cat([slots(r, torch.arange(n)) for r, n in enumerate(prompt_lens)]),
                             sdpa_attention, cu, 9)
        got = copy(ids, pos, cu, 9, cache, lambda h, w: h[cu[1:] - 1] @ w.T)
        _assert_close(got, torch.stack([full[r][n - 1] for r, n in enumerate(prompt_lens)]))
        for step in range(steps):
            pos = torch.tensor(prompt_lens) + step
            ids = torch.stack([seqs[r][p] for r, p in enumerate(pos)])
            cache = DecodeCache(kv, torch.stack([slots(r, p) for r, p in enumerate(pos)]), tables,
                                (pos + 1).int(), impl)
            got = copy(ids, pos, torch.arange(3, dtype=torch.int32), 1, cache, lambda h, w: h @ w.T)
            _assert_close(got, torch.stack([full[r][p] for r, p in enumerate(pos)]))


def _assert_close(got, ref):
    assert got.shape == ref.shape
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_only_the_gemv_layers_launch_with_programmatic_dependent_launch():
    """`gemv_pdl` launches the GEMV path's kernels (and the decode attention between them) with PDL;
    the skinny path's and the plain path's launch plainly."""
    copy = InferenceModel(CONFIGS["qwen2"], device="cpu", dtype=torch.float32, impl="triton", gemv_max_tokens=1,
                          skinny_max_tokens=16, gemv_pdl=True)
    assert [copy.layer_path(t) for t in (1, 2, 16, 17)] == ["gemv", "skinny", "skinny", "plain"]
    assert [copy.launches_with_pdl(t) for t in (1, 2, 16, 17)] == [True, False, False, False]
    assert not InferenceModel(CONFIGS["qwen2"], device="cpu", dtype=torch.float32, impl="triton",
                              gemv_max_tokens=1).launches_with_pdl(1)
