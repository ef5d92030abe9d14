"""Next-token sampling benchmarks: oreal_fast.kernels.sample_from_logits beside another commit's
version, torch.sort and FlashInfer.

Run: `pytest benchmarks/test_bench_sampling.py --benchmark-only` (CUDA only; flashinfer skips
unless it imports). Inputs: bf16 logits [B, V = 151936], N(0, spread^2) per entry: spread 0.6 is
about what a random-init 0.5B model gives (the engine benchmarks' rows), spread 1 a flat row (top-p
0.9 keeps about a third of V), spread 3 closer to a trained language model (~10^2-10^3 tokens kept
at top-p 0.9).
Modes: `top_p` (0.9 alone, the official setting), `top_k_top_p` (top-k 20, then top-p 0.9),
`plain` (temperature only).
Providers: `oreal_fast` (the Triton kernels), `oreal_fast_logprobs` (the same with each sampled
token's log-prob, as the engine samples: what the log-prob costs), `baseline` (the same file of the
oreal_fast under $BASELINE_ROOT, see benchmarks/baseline.py; skipped without it), `torch_sort` (the
official rule: `sample_next_token`, filter_logits + softmax + multinomial), `flashinfer`. Ours and
baseline are timed as a CUDA graph of one call
(their uniforms drawn once, outside), the others eagerly.
Each case records extra_info: `ms` (median), `gb_per_s` (the logits' bytes, read once, over the
median time), and for oreal_fast `resolved` (the fraction of rows that took the two sweeps; the
rest took the search fallback).
"""

import importlib

import pytest
import torch

from baseline import baseline_module
from oreal_fast.kernels import sample_from_logits, sample_with_logprobs
from oreal_fast.rollout.base import SamplingParams
from oreal_fast.rollout.sampling import sample_next_token

smp = importlib.import_module("oreal_fast.kernels.sampling")

V = 151936  # Qwen2.5 vocabulary (LM-head rows)
MODES = {"top_p": (0, 0.9), "top_k_top_p": (20, 0.9), "plain": (0, 1.0)}  # (top_k, top_p)
CASES = ([("top_p", b, s) for b in (1, 64, 256, 1024) for s in (1.0, 3.0)]
         + [("top_p", 256, 0.6), ("top_k_top_p", 256, 1.0), ("top_k_top_p", 256, 3.0), ("plain", 256, 3.0)])
PROVIDERS = ("oreal_fast", "oreal_fast_logprobs", "baseline", "torch_sort", "flashinfer")


def _sample_fn(provider: str, logits: torch.Tensor, top_k: int, top_p: float, g: torch.Generator):
    """A function () -> tokens [B] over the fixed logits."""
    uniform = torch.rand(logits.shape[0], generator=g, device=logits.device)
    if provider == "oreal_fast":
        return lambda: sample_from_logits(logits, uniform, top_k=top_k, top_p=top_p)
    if provider == "oreal_fast_logprobs":
        return lambda: sample_with_logprobs(logits, uniform, top_k=top_k, top_p=top_p)
    if provider == "baseline":
        base = baseline_module("kernels/sampling.py")
        return lambda: base.sample_from_logits(logits, uniform, top_k=top_k, top_p=top_p)
    if provider == "torch_sort":
        params = SamplingParams(max_new_tokens=1, max_length=2, top_k=top_k, top_p=top_p)
        return lambda: sample_next_token(logits, params, g)
    fi = pytest.importorskip("flashinfer.sampling")
    if top_k > 0:
        return lambda: fi.top_k_top_p_sampling_from_logits(logits, top_k, top_p, generator=g)
    return lambda: fi.top_p_sampling_from_probs(logits.float().softmax(-1), top_p, generator=g)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("mode,B,spread", CASES, ids=[f"{m}-B{b}-s{s}" for m, b, s in CASES])
def test_sampling(benchmark, mode, B, spread, provider):
    top_k, top_p = MODES[mode]
    if provider == "flashinfer" and mode == "plain":
        pytest.skip("flashinfer: filtered sampling only")
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(B, V, device="cuda", generator=g) * spread).bfloat16()
    fn = _sample_fn(provider, logits, top_k, top_p, g)
    if provider in ("oreal_fast", "oreal_fast_logprobs", "baseline"):
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        fn = graph.replay

    def step():
        fn()
        torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=20, warmup_rounds=3, iterations=1)
    median_s = benchmark.stats.stats.median
    benchmark.extra_info.update(B=B, V=V, spread=spread, top_k=top_k, top_p=top_p, ms=median_s * 1e3,
                                gb_per_s=logits.numel() * logits.element_size() / median_s / 1e9)
    if provider == "oreal_fast":
        uniform = torch.rand(B, generator=g, device="cuda")
        _, resolved, _ = smp._sample(logits, uniform, 1.0, top_k, top_p, smp._config(logits.device, V))
        benchmark.extra_info["resolved"] = float(resolved.float().mean())
