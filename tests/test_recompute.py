"""Selective recompute changes memory, not math: same loss, same gradients, same state-dict keys."""

from __future__ import annotations

import pytest
import torch

from oreal_fast.data.packing import pack_sequences
from oreal_fast.model.decoder import Decoder, DecoderConfig
from oreal_fast.recompute import apply_selective_recompute


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
    assert apply_selective_recompute(model, ratio) == wrapped
    assert list(model.state_dict()) == keys
    loss1, grads1 = loss_and_grads(model)
    assert torch.equal(loss0, loss1)
    assert grads1.keys() == grads0.keys()
    for name, g in grads0.items():
        torch.testing.assert_close(grads1[name], g, rtol=1e-6, atol=1e-7, msg=name)


def test_ratio_outside_unit_interval_is_refused():
    with pytest.raises(ValueError, match="selective_recompute"):
        apply_selective_recompute(tiny_decoder(), 1.5)
