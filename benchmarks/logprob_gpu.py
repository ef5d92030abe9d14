"""The rollout log-prob check on a GPU, and what a KV-pool resize costs, at the official batch.

  python -m benchmarks.logprob_gpu --out logprob_gpu.json [--max-new 512] [--tiny]

Random-init Qwen2.5-0.5B shape. The actor is what the trainer holds: fp32 masters computing in
bf16 (autocast), Triton trunk ops; the paged engine copies it in bf16 (CUDA graphs, rounds of 16
decode steps). Per case, the engine generates and returns each token's log-prob (its unmodified
distribution, temperature 1); the trainer's are `rl_step.action_logprobs` over the same samples,
packed into micro-batches of `rl_micro_batch_tokens` as the RL phase packs them (the same
weights: the step's optimiser update comes after). Reported: mean, p99 and max |engine - trainer|
over every generated token, the token count and the generation time.

- official: 64 prompts x 16 samples (prompts of 64-320 random tokens), official sampling
  (temperature 1, top-p 0.9), `--max-new` tokens each (no stop token: random weights never stop);
- greedy: 16 prompts, greedy (the engine's `token_logprobs` path).
Resize: the engine at the official shape (max_num_seqs 1024) resized to half its pool and back,
each timed with a synchronize (free, allocate and zero the pool, recapture every bucket's graph),
and a greedy call before and after, whose tokens must be equal.

`--tiny` checks the script on the CPU (2 layers, 8 x 4 samples, fp32 compute). JSON to `--out`,
the table printed at the end.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from oreal_fast.config import TrainConfig
from oreal_fast.kernels.trunk_train import trunk_ops_for
from oreal_fast.model.decoder import Decoder, DecoderConfig
from oreal_fast.rl_step import RLSettings, action_logprobs
from oreal_fast.rollout import EngineConfig, PagedEngine, SamplingParams
from oreal_fast.runtime import Precision
from oreal_fast.trajectories import Trajectory, iter_micro_batches, plan_micro_batches

QWEN25_05B = DecoderConfig(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                           tie_embeddings=True, qkv_bias=True)
TINY = DecoderConfig(family="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6, tie_embeddings=True, qkv_bias=True)
RL_MICRO_BATCH_TOKENS = 32768  # the config default (configs/a100_40g.py)


def make_actor(config: DecoderConfig, device: torch.device, compute_dtype: torch.dtype) -> Decoder:
    """The trainer's actor: fp32 masters, `compute_dtype` forwards, the config's default trunk ops."""
    torch.manual_seed(0)
    actor = Decoder(config, device=device, dtype=torch.float32, compute_dtype=compute_dtype,
                    trunk_ops=trunk_ops_for("auto", device))
    actor.init_weights()
    return actor.requires_grad_(False).eval()


def trainer_logprobs(actor: Decoder, prompts: list[list[int]], responses: list[list[int]], precision: Precision,
                     token_budget: int = RL_MICRO_BATCH_TOKENS) -> torch.Tensor:
    """The RL phase's actor log-probs of every response token, in sample order: [sum of lengths] fp32."""
    settings = RLSettings.from_config(TrainConfig(actor="unused", datasets="none", threshold_rescale=True), precision)
    samples = [Trajectory(p, r, 1.0, 0.0) for p, r in zip(prompts, responses)]
    plan = plan_micro_batches([t.num_tokens for t in samples], 1, token_budget)
    with torch.no_grad():
        return torch.cat([action_logprobs(actor, batch, settings).float()
                          for batch in iter_micro_batches(samples, plan, precision.device)])


def rollout_logprob_diffs(actor: Decoder, prompts: list[list[int]], responses: list[list[int]],
                          engine_logprobs: list[torch.Tensor], precision: Precision) -> torch.Tensor:
    """|engine - trainer| log-prob of every generated token, in sample order: [N] fp32 on the host."""
    ours = torch.cat(engine_logprobs)
    theirs = trainer_logprobs(actor, prompts, responses, precision).cpu()
    assert ours.shape == theirs.shape, f"{ours.shape} engine log-probs, {theirs.shape} trainer log-probs"
    return (ours - theirs).abs()


def random_prompts(num: int, vocab: int, lengths: tuple[int, int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lengths[0], lengths[1] + 1, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(engine: PagedEngine, actor: Decoder, prompts: list[list[int]], params: SamplingParams,
             precision: Precision) -> dict:
    t0 = time.perf_counter()
    responses = engine.generate(prompts, params, torch.Generator(engine.device).manual_seed(1))
    sync(engine.device)
    seconds = time.perf_counter() - t0
    diffs = rollout_logprob_diffs(actor, prompts, responses, engine.response_logprobs(), precision)
    return {"samples": len(prompts), "tokens": diffs.numel(), "gen_s": seconds,
            "mean": float(diffs.mean()), "p99": float(diffs.quantile(0.99)), "max": float(diffs.max())}


def time_resizes(engine: PagedEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Resize to half the pool and back, each timed; greedy tokens before, between and after."""
    device = engine.device
    before = engine.generate(prompts, params, torch.Generator(device))
    full = engine.pool_bytes
    seconds = []
    for size in (full // 2, full):
        sync(device)
        t0 = time.perf_counter()
        engine.resize_pool(size)
        sync(device)
        seconds.append(time.perf_counter() - t0)
        if size != full:
            between = engine.generate(prompts, params, torch.Generator(device))
    after = engine.generate(prompts, params, torch.Generator(device))
    return {"pool_gib": full / 2**30, "shrink_s": seconds[0], "grow_s": seconds[1],
            "graph_buckets": len(engine.runner.buckets) if engine.runner.use_graphs else 0,
            "greedy_equal_after_resizes": before == between == after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="logprob_gpu.json")
    parser.add_argument("--max-new", type=int, default=512)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU (checks the script)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    config, compute = (TINY, torch.float32) if args.tiny else (QWEN25_05B, torch.bfloat16)
    num_prompts, k = (8, 4) if args.tiny else (64, 16)
    precision = Precision(device, compute)
    actor = make_actor(config, device, compute)
    max_len = 320 + args.max_new
    engine = PagedEngine(actor, EngineConfig(max_model_len=max_len, kv_cache_bytes=(2**24 if args.tiny else 16 * 2**30),
                                             max_num_seqs=num_prompts * k, max_prefill_batch=16),
                         dtype=compute)
    prompts = random_prompts(num_prompts, config.vocab_size, (64, 320), seed=2)
    sampled = SamplingParams(max_new_tokens=args.max_new, max_length=max_len, top_p=0.9, temperature=1.0)
    greedy = SamplingParams(max_new_tokens=args.max_new, max_length=max_len, do_sample=False)
    results = {
        "official": run_case(engine, actor, [p for p in prompts for _ in range(k)], sampled, precision),
        "greedy": run_case(engine, actor, prompts[:16], greedy, precision),
    }
    resize = time_resizes(engine, prompts[:16], SamplingParams(max_new_tokens=32, max_length=max_len, do_sample=False))
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    with open(args.out, "w") as f:
        json.dump({"device": device_name, "max_new": args.max_new, "cases": results, "resize": resize}, f, indent=1)
    print(f"\n{device_name}, max_new {args.max_new}: |engine - trainer| log-prob over generated tokens")
    print(f"{'case':<10}{'samples':>8}{'tokens':>10}{'gen s':>8}{'mean':>11}{'p99':>11}{'max':>11}")
    for name, r in results.items():
        print(f"{name:<10}{r['samples']:>8}{r['tokens']:>10}{r['gen_s']:>8.1f}{r['mean']:>11.3e}{r['p99']:>11.3e}"
              f"{r['max']:>11.3e}")
    print(f"resize of a {resize['pool_gib']:.2f} GiB pool ({resize['graph_buckets']} graph buckets): "
          f"shrink {resize['shrink_s']:.2f} s, grow {resize['grow_s']:.2f} s, "
          f"greedy tokens equal after: {resize['greedy_equal_after_resizes']}")


if __name__ == "__main__":
    main()
