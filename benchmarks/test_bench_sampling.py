"""Next-token sampling benchmarks: oreal_fast.kernels.sample_from_logits beside torch.sort and FlashInfer.

Run: `pytest benchmarks/test_bench_sampling.py --benchmark-only` (CUDA only; flashinfer skips
unless it imports). Inputs: bf16 logits [B, V = 151936], N(0, spread^2) per entry: spread 1 is a
flat row (top-p 0.9 keeps about a third of V: the most passes for a threshold search), spread 3
is closer to a language model (~10^2-10^3 tokens kept at top-p 0.9).
Modes: `top_p` (0.9 alone, the official setting) and `top_k_top_p` (top-k 20, then top-p 0.9).
Providers: `torch_sort` (the current `sample_next_token`: filter_logits + softmax + multinomial),
`oreal_fast` (the Triton kernel, its uniform drawn inside the timed step), `flashinfer`.
Each case records extra_info["us"] (median microseconds) and extra_info["gb_per_s"] (the logits'
bytes, read once, over the median time).
"""

import pytest
import torch

from oreal_fast.kernels import sample_from_logits
from oreal_fast.rollout.base import SamplingParams
from oreal_fast.rollout.sampling import sample_next_token

V = 151936  # Qwen2.5 vocabulary (LM-head rows)
BATCHES = (64, 256, 1024)
MODES = {"top_p": (0, 0.9), "top_k_top_p": (20, 0.9)}  # (top_k, top_p)
SPREADS = (1.0, 3.0)
PROVIDERS = ("torch_sort", "oreal_fast", "flashinfer")


def _sample_fn(provider: str, top_k: int, top_p: float, g: torch.Generator):
    """A function logits [B, V] -> tokens [B]."""
    if provider == "torch_sort":
        params = SamplingParams(max_new_tokens=1, max_length=2, top_k=top_k, top_p=top_p)
        return lambda x: sample_next_token(x, params, g)
    if provider == "oreal_fast":
        return lambda x: sample_from_logits(x, torch.rand(x.shape[0], generator=g, device=x.device),
                                            top_k=top_k, top_p=top_p)
    fi = pytest.importorskip("flashinfer.sampling")
    if top_k > 0:
        return lambda x: fi.top_k_top_p_sampling_from_logits(x, top_k, top_p, generator=g)
    return lambda x: fi.top_p_sampling_from_probs(x.float().softmax(-1), top_p, generator=g)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("spread", SPREADS)
@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("mode", list(MODES))
def test_sampling(benchmark, mode, B, spread, provider):
    top_k, top_p = MODES[mode]
    g = torch.Generator(device="cuda").manual_seed(0)
    fn = _sample_fn(provider, top_k, top_p, g)
    logits = (torch.randn(B, V, device="cuda", generator=g) * spread).bfloat16()

    def step():
        fn(logits)
        torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=20, warmup_rounds=3, iterations=1)
    median_s = benchmark.stats.stats.median
    benchmark.extra_info["us"] = median_s * 1e6
    benchmark.extra_info["gb_per_s"] = logits.numel() * logits.element_size() / median_s / 1e9
    benchmark.extra_info["B"], benchmark.extra_info["V"] = B, V
