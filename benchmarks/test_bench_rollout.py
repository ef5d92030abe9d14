"""Generation throughput at Qwen2.5-0.5B shape (random init, bf16): our paged engine against
transformers `generate` and our plain sampler, plus the official rollout shape.

Run: `pytest benchmarks/test_bench_rollout.py --benchmark-only` (CUDA only).
Cases (batch in the id), B prompts of 128 random tokens, 256 new tokens each, top-p 0.9, no stop
token (every response runs to 256), one timed round after a warm-up:
  hf_generate_static   transformers generate, static cache (compiled by transformers), warmed at the same shape
  hf_generate_dynamic  transformers generate, default dynamic cache
  plain_sampler        our PlainSampler (contiguous KV cache, eager decode)
  oreal_fast           the paged engine (CUDA graphs, block size 16), pool sized to hold the batch
  oreal_fast-official  64 prompts x 16 samples sharing a 600-token prompt (each prompt's own tokens),
                       response lengths drawn once (seed 0) from a lognormal with median 1200 and
                       sigma 1.0, capped so that prompt + response <= 16 384, each response stopped
                       at its drawn length; 20 GiB KV pool. The cap on the case's time is the
                       distribution: ~2.0 M new tokens, the longest response (the tail decoded at
                       a small batch) about 15.8 k tokens.
  oreal_fast-official-shared64  the same with `shared_prefix_min_rows` 64 (in decode steps of 64 rows
                       or more, each prompt's blocks read once per group of its samples)
extra_info: tokens_per_s (new tokens over the round's wall time), peak_gib (peak allocated device
memory in the round, weights included), oreal_fast_path (the file of the oreal_fast this run
imported: which tree a baseline run measured); for oreal_fast cases the engine's stats too.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import oreal_fast
from oreal_fast.model import decoder_from_hf
from oreal_fast.rollout import EngineConfig, PagedEngine, PlainSampler, SamplingParams

PROMPT, NEW = 128, 256
PARAMS = SamplingParams(max_new_tokens=NEW, max_length=PROMPT + NEW, top_p=0.9)
BATCHES = {"hf_generate_static": (256,), "hf_generate_dynamic": (256,), "plain_sampler": (256,),
           "oreal_fast": (64, 256, 1024)}
OFFICIAL = {"oreal_fast-official": {}, "oreal_fast-official-shared64": {"shared_prefix_min_rows": 64}}
CASES = [f"{p}-B{b}" for p, bs in BATCHES.items() for b in bs] + list(OFFICIAL)
KV_BYTES_PER_TOKEN = 24 * 2 * 2 * 64 * 2


@pytest.fixture(scope="module")
def models():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                         rope_theta=1e6, max_position_embeddings=32768, attn_implementation="sdpa")
    hf = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16).eval()
    ours = decoder_from_hf(hf.config, hf.state_dict(), dtype=torch.bfloat16, device="cuda").eval()
    return hf, ours


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 151000, (n, length), generator=g).tolist()


def _hf(hf, batch: int, cache: str | None):
    ids = torch.tensor(_prompts(batch, PROMPT), device="cuda")
    hf.generation_config.eos_token_id = None  # no stop token: every row runs to NEW tokens
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=True,
                  top_p=0.9, top_k=0, temperature=1.0, pad_token_id=0)
    if cache:
        kwargs["cache_implementation"] = cache

    def run():
        with torch.no_grad():
            out = hf.generate(ids, **kwargs)
        return out.shape[0] * (out.shape[1] - PROMPT)
    return run


def _plain(ours, batch: int):
    sampler = PlainSampler(ours, max_batch_size=batch)
    prompts = _prompts(batch, PROMPT)
    return lambda: sum(map(len, sampler.generate(prompts, PARAMS, torch.Generator("cuda").manual_seed(0))))


def _engine(ours, batch: int, holder: dict):
    engine = PagedEngine(ours, EngineConfig(max_model_len=PROMPT + NEW, max_num_seqs=batch,
                                            kv_cache_bytes=int(1.05 * batch * (PROMPT + NEW) * KV_BYTES_PER_TOKEN)))
    holder["engine"] = engine
    prompts = _prompts(batch, PROMPT)
    return lambda: sum(map(len, engine.generate(prompts, PARAMS, torch.Generator("cuda").manual_seed(0))))


def _official(ours, holder: dict, **engine_config):
    max_len = 16384
    rng = np.random.default_rng(0)
    prompts = [p for p in _prompts(64, 600) for _ in range(16)]
    lengths = np.clip(rng.lognormal(np.log(1200), 1.0, size=len(prompts)), 1, max_len - 600).astype(int).tolist()
    params = SamplingParams(max_new_tokens=max_len - 600, max_length=max_len, top_p=0.9)
    engine = PagedEngine(ours, EngineConfig(max_model_len=max_len, kv_cache_bytes=20 * 2**30, max_num_seqs=1024,
                                            **engine_config))
    holder["engine"] = engine
    return lambda: sum(map(len, engine.generate(prompts, params, torch.Generator("cuda").manual_seed(0),
                                                max_new_per_prompt=lengths)))


@pytest.mark.parametrize("case", CASES)
def test_generate(benchmark, models, case):
    hf, ours = models
    gc.collect()
    torch.cuda.empty_cache()
    holder: dict = {}
    provider, _, size = case.rpartition("-")
    if case in OFFICIAL:
        run = _official(ours, holder, **OFFICIAL[case])
    else:
        batch = int(size[1:])
        run = {"hf_generate_static": lambda: _hf(hf, batch, "static"),
               "hf_generate_dynamic": lambda: _hf(hf, batch, None),
               "plain_sampler": lambda: _plain(ours, batch),
               "oreal_fast": lambda: _engine(ours, batch, holder)}[provider]()
        if provider == "hf_generate_static":
            run()  # transformers compiles its forward at the first call of this shape
        elif "engine" in holder:  # Triton kernels compile, allocator primed, at the batch's shapes
            holder["engine"].generate(_prompts(batch, PROMPT, seed=1),
                                      SamplingParams(max_new_tokens=4, max_length=PROMPT + NEW, top_p=0.9),
                                      torch.Generator("cuda").manual_seed(1))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    counted = {}

    def timed():
        counted["tokens"] = run()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=1, iterations=1)
    benchmark.extra_info["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    benchmark.extra_info["tokens_per_s"] = counted["tokens"] / benchmark.stats.stats.median
    benchmark.extra_info["oreal_fast_path"] = oreal_fast.__file__
    benchmark.extra_info["wall_s"] = benchmark.stats.stats.median
    if "engine" in holder:
        benchmark.extra_info.update({f"engine_{k}": v for k, v in holder["engine"].stats().items()})
