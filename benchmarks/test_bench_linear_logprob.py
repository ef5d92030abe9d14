"""LM-head logprob benchmarks: oreal_fast.kernels.linear_logprob beside its peers.

Run: `pytest benchmarks/ --benchmark-only` (CUDA only; peers that are not installed skip).
Inputs are bf16 hidden [T, H] and head weight [V, H], int64 labels with 10 % ignored (-100).
Modes:
  policy          (logprobs * w).sum() forward + backward (dH, dW)
  reference       logprobs forward only, under torch.no_grad
  policy_entropy  (logprobs * w + entropy * u).sum() forward + backward (only eager,
                  torch_compile and oreal_fast offer an entropy gradient)
Each case records extra_info["peak_gib"]: peak device memory above what was allocated before the
call (the inputs), gradients included; and extra_info["tflops"]: the useful GEMM work (2*T*V*H
FLOPs per pass: one pass forward-only, three with backward: logits, dH, dW) over the median time.
"""

import pytest
import torch

from oreal_fast.kernels import IGNORE_INDEX, linear_logprob

V = 151936  # Qwen2.5 vocabulary (LM-head rows)
SHAPES = {  # id: (T, H)
    "T16384-H896": (16384, 896),
    "T4096-H896": (4096, 896),
    "T32768-H896": (32768, 896),
    "T16384-H2048": (16384, 2048),
}
ANCHOR = "T16384-H896"  # the only shape eager and torch.compile run at (compile time, memory)
MODES = ("policy", "reference", "policy_entropy")
PROVIDERS = ("eager", "torch_compile", "cce", "liger_flce", "oreal_fast")
ENTROPY_COEF = 0.01


def _eager_logprob(hidden, weight, labels, with_entropy: bool):
    logp = (hidden @ weight.T).float().log_softmax(-1)  # (T, V) fp32
    keep = labels != IGNORE_INDEX
    lp = logp.gather(-1, labels.clamp(min=0)[:, None])[:, 0] * keep
    ent = -(logp.exp() * logp).sum(-1) * keep if with_entropy else None
    return lp, ent


_compiled = torch.compile(_eager_logprob, dynamic=False)


def _logprob_fn(provider: str, mode: str):
    """A function (hidden, weight, labels) -> (logprobs [T], entropy [T] or None)."""
    with_entropy = mode == "policy_entropy"
    if provider == "eager":
        return lambda h, w, lab: _eager_logprob(h, w, lab, with_entropy)
    if provider == "torch_compile":
        return lambda h, w, lab: _compiled(h, w, lab, with_entropy)
    if provider == "oreal_fast":
        if with_entropy:
            return lambda h, w, lab: linear_logprob(h, w, lab, return_entropy=True)
        return lambda h, w, lab: (linear_logprob(h, w, lab), None)
    if with_entropy:
        pytest.skip(f"{provider} has no entropy output")
    if provider == "cce":
        cce = pytest.importorskip("cut_cross_entropy")
        return lambda h, w, lab: (-cce.linear_cross_entropy(h, w, lab, reduction="none"), None)
    liger = pytest.importorskip("liger_kernel.transformers")
    loss = liger.LigerFusedLinearCrossEntropyLoss(reduction="none")
    return lambda h, w, lab: (-loss(w, h, lab).float(), None)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode", MODES)
def test_linear_logprob(benchmark, mode, shape, provider):
    if provider in ("eager", "torch_compile") and shape != ANCHOR:
        pytest.skip(f"{provider} runs at {ANCHOR} only")
    fn = _logprob_fn(provider, mode)
    T, H = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = (torch.randn(T, H, device="cuda", generator=g) * 4 / H**0.5).bfloat16()
    weight = torch.randn(V, H, device="cuda", generator=g).bfloat16()
    labels = torch.randint(0, V, (T,), device="cuda", generator=g)
    labels[torch.rand(T, device="cuda", generator=g) < 0.1] = IGNORE_INDEX
    w_lp = torch.randn(T, device="cuda", generator=g)
    w_ent = torch.randn(T, device="cuda", generator=g) * ENTROPY_COEF
    train = mode != "reference"
    hidden.requires_grad_(train)
    weight.requires_grad_(train)
    peak = [0]

    def setup():
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        peak.append(-torch.cuda.memory_allocated())

    def step():
        if train:
            lp, ent = fn(hidden, weight, labels)
            loss = (lp * w_lp).sum() + ((ent * w_ent).sum() if ent is not None else 0)
            loss.backward()
        else:
            with torch.no_grad():
                fn(hidden, weight, labels)
        torch.cuda.synchronize()
        peak[-1] += torch.cuda.max_memory_allocated()

    benchmark.pedantic(step, setup=setup, rounds=10, warmup_rounds=2, iterations=1)
    passes = 3 if train else 1
    median_s = benchmark.stats.stats.median
    benchmark.extra_info["peak_gib"] = max(peak[-10:]) / 2**30
    benchmark.extra_info["tflops"] = 2 * passes * T * V * H / median_s / 1e12
    benchmark.extra_info["T"], benchmark.extra_info["H"], benchmark.extra_info["V"] = T, H, V
