"""A tiny random Qwen2 model (transformers) and our Decoder on the same weights."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from oreal_fast.model import decoder_from_hf


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    # a wide init spreads the logits so that greedy choices are far from ties
    cfg = Qwen2Config(vocab_size=61, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, initializer_range=0.2)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    return hf, decoder_from_hf(hf.config, hf.state_dict(), dtype=torch.float32, device="cpu")
