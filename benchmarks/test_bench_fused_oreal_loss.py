"""OREAL actor loss from the LM head, forward + backward: fused_oreal_loss beside its alternatives.

Run: `pytest benchmarks/ --benchmark-only` (CUDA only).
Inputs are bf16 hidden [T, H] and head weight [V, H], int64 labels with 10 % ignored (-100), and
the per-token loss inputs of a micro-batch (reference log-probs, advantages, signs, RM weights).
Each case computes the loss (`oreal_actor_loss`'s terms) and back-propagates it to hidden and
weight.
Providers:
  oreal_fast                 fused_oreal_loss: three GEMM passes, the gradient formed in the forward
  oreal_fast_linear_logprob  linear_logprob, then oreal_actor_loss on the [T] log-probs
  torch_compile, eager       full [T, V] logits, log_softmax, gather, oreal_actor_loss
Each case records extra_info["peak_gib"]: peak device memory above what was allocated before the
call (the inputs), gradients included; and extra_info["tflops"]: the useful GEMM work (three
2*T*V*H passes: logits, dH, dW) over the median time.
"""

import pytest
import torch

from oreal_fast.algo.loss import ActorLossInputs, LossCoefficients, oreal_actor_loss
from oreal_fast.algo.normalisers import Normalisers
from oreal_fast.kernels import IGNORE_INDEX, fused_oreal_loss, linear_logprob

V = 151936  # Qwen2.5 vocabulary (LM-head rows)
SHAPES = {  # id: (T, H)
    "T16384-H896": (16384, 896),
    "T4096-H896": (4096, 896),
    "T32768-H896": (32768, 896),
    "T16384-H2048": (16384, 2048),
}
ANCHOR = "T16384-H896"  # the only shape eager and torch.compile run at (compile time, memory)
PROVIDERS = ("eager", "torch_compile", "oreal_fast_linear_logprob", "oreal_fast")
COEFS = LossCoefficients(positive_loss_factor=1.0, negative_loss_factor=0.5, kl_coef=0.01,
                         kl_type="unbias", pos_mult_adv=True)


def _eager_loss(hidden, weight, labels, ref, adv, is_pos, w_pos, w_neg, norm):
    logp = (hidden @ weight.T).float().log_softmax(-1)  # (T, V) fp32
    lp = logp.gather(-1, labels.clamp(min=0)[:, None])[:, 0] * (labels != IGNORE_INDEX)
    return oreal_actor_loss(lp, ActorLossInputs(ref, adv, is_pos, w_pos, w_neg, norm), COEFS).loss


_compiled = torch.compile(_eager_loss, dynamic=False)


def _linear_logprob_loss(hidden, weight, labels, ref, adv, is_pos, w_pos, w_neg, norm):
    lp = linear_logprob(hidden, weight, labels)
    return oreal_actor_loss(lp, ActorLossInputs(ref, adv, is_pos, w_pos, w_neg, norm), COEFS).loss


def _fused_loss(hidden, weight, labels, ref, adv, is_pos, w_pos, w_neg, norm):
    inputs = ActorLossInputs(ref, adv, is_pos, w_pos, w_neg, norm)
    return fused_oreal_loss(hidden, weight, labels, inputs, COEFS)[0].loss


LOSS_FNS = {"eager": _eager_loss, "torch_compile": _compiled,
            "oreal_fast_linear_logprob": _linear_logprob_loss, "oreal_fast": _fused_loss}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_oreal_loss(benchmark, shape, provider):
    if provider in ("eager", "torch_compile") and shape != ANCHOR:
        pytest.skip(f"{provider} runs at {ANCHOR} only")
    fn = LOSS_FNS[provider]
    T, H = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = (torch.randn(T, H, device="cuda", generator=g) * 4 / H**0.5).bfloat16()
    weight = torch.randn(V, H, device="cuda", generator=g).bfloat16()
    labels = torch.randint(0, V, (T,), device="cuda", generator=g)
    labels[torch.rand(T, device="cuda", generator=g) < 0.1] = IGNORE_INDEX
    is_pos = torch.rand(T, device="cuda", generator=g) < 0.4
    adv = torch.where(is_pos, 1.0, -0.7) + 0.2 * torch.randn(T, device="cuda", generator=g)
    ref = -20 + torch.randn(T, device="cuda", generator=g)
    w_pos, w_neg = (torch.rand(T, device="cuda", generator=g) for _ in range(2))
    n_pos = 4 * T // 10
    norm = Normalisers(*(torch.tensor(n, device="cuda") for n in (T, n_pos, T - n_pos, 64)))
    hidden.requires_grad_()
    weight.requires_grad_()
    peak = [0]

    def setup():
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        peak.append(-torch.cuda.memory_allocated())

    def step():
        fn(hidden, weight, labels, ref, adv, is_pos, w_pos, w_neg, norm).backward()
        torch.cuda.synchronize()
        peak[-1] += torch.cuda.max_memory_allocated()

    benchmark.pedantic(step, setup=setup, rounds=10, warmup_rounds=2, iterations=1)
    median_s = benchmark.stats.stats.median
    benchmark.extra_info["peak_gib"] = max(peak[-10:]) / 2**30
    benchmark.extra_info["tflops"] = 2 * 3 * T * V * H / median_s / 1e12
    benchmark.extra_info["T"], benchmark.extra_info["H"], benchmark.extra_info["V"] = T, H, V
