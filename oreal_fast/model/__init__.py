"""Packed Llama/Qwen2 decoder, token-level reward model, attention backends and HF I/O."""

from oreal_fast.model.decoder import Decoder, DecoderConfig, TokenRewardModel
from oreal_fast.model.hf_io import (
    decoder_from_hf,
    load_decoder,
    load_token_rm,
    load_tokenizer,
    save_hf_checkpoint,
)

__all__ = [
    "Decoder",
    "DecoderConfig",
    "TokenRewardModel",
    "decoder_from_hf",
    "load_decoder",
    "load_token_rm",
    "load_tokenizer",
    "save_hf_checkpoint",
]
