"""Tiny random transformers models shared by the model tests (fp32, CPU)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16, "rope_theta": 500000.0,
}
SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
# family configs: Qwen2 (qkv bias, tied), Llama (untied, MHA, head_dim != H/heads), Llama 3 rope + attention bias
HF_CONFIGS = {
    "qwen2_tied": lambda: Qwen2Config(**SMALL, tie_word_embeddings=True, rope_theta=1e6),
    "llama_untied": lambda: LlamaConfig(**{**SMALL, "num_key_value_heads": 4}, head_dim=24, rms_norm_eps=1e-5),
    "llama3_rope_bias": lambda: LlamaConfig(**SMALL, attention_bias=True, rope_parameters=LLAMA3_ROPE),
}


def make_hf_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A random fp32 model; biases and norm weights are randomised too so that every map entry matters."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(HF_CONFIGS[name](), dtype=torch.float32).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(params=sorted(HF_CONFIGS))
def hf_model(request) -> torch.nn.Module:
    return make_hf_model(request.param)


@pytest.fixture
def make_hf():
    return make_hf_model
