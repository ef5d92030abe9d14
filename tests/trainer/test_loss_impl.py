"""A full OREAL micro-batch gives the same losses and the same parameter gradients with the Triton
LM-head kernels (loss_impl="triton"; loss_kernel linear_logprob or fused_oreal_loss) as with their
eager twin: on CPU under the Triton interpreter in fp32, and on a GPU in bf16."""

from __future__ import annotations

import os

import pytest
import torch

from oreal_fast.algo import global_normalisers
from oreal_fast.config import load_config
from oreal_fast.model.hf_io import load_decoder, load_token_rm
from oreal_fast.rl_step import RLSettings, rl_micro_step
from oreal_fast.runtime import Precision, RLModels
from oreal_fast.trajectories import Trajectory, make_micro_batch

from trainer_helpers import write_config

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
CASES = [
    pytest.param("cpu", torch.float32, 1e-5, 1e-4, marks=pytest.mark.skipif(
        not INTERPRETER, reason="the Triton kernels run on CPU only under TRITON_INTERPRET=1")),
    pytest.param("cuda", torch.bfloat16, 2e-3, 1e-2, marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]


def micro_step(cfg, actor_dir, ref_dir, device, dtype, impl, loss_kernel="linear_logprob"):
    dev = torch.device(device)
    models = RLModels(
        actor=load_decoder(actor_dir, dtype=torch.float32, device=dev, compute_dtype=dtype),
        reference=load_decoder(ref_dir, dtype=dtype, device=dev),
        token_rm=load_token_rm(ref_dir, dtype=torch.float32, device=dev, compute_dtype=dtype),
    )
    with torch.no_grad():
        head = torch.randn(1, 32, generator=torch.Generator().manual_seed(0))
        models.token_rm.score_head.weight.copy_(head.to(dev))
    gen = torch.Generator().manual_seed(5)
    trajs = [Trajectory(prompt_ids=torch.randint(0, 259, (n_p,), generator=gen).tolist(),
                        response_ids=torch.randint(0, 259, (n_r,), generator=gen).tolist(),
                        reward=r, advantage=a)
             for n_p, n_r, r, a in [(23, 41, 1.0, 0.75), (23, 67, -1.0, -0.25)]]
    batch = make_micro_batch(trajs)
    norm = global_normalisers(torch.tensor([41, 67], device=dev), torch.tensor([1.0, -1.0], device=dev))
    cfg.loss_impl, cfg.loss_kernel = impl, loss_kernel
    settings = RLSettings.from_config(cfg, Precision(dev, dtype))
    sums = rl_micro_step(models, batch.to(dev), norm, settings, update_actor=True)
    grads = {f"actor.{n}": p.grad.float().cpu() for n, p in models.actor.named_parameters()}
    grads.update({f"rm.{n}": p.grad.float().cpu() for n, p in models.token_rm.named_parameters()})
    return {k: float(v) for k, v in sums._asdict().items()}, grads


@pytest.mark.parametrize("loss_kernel", ["linear_logprob", "fused_oreal_loss"])
@pytest.mark.parametrize("device,dtype,rel,grad_rel", CASES)
def test_fused_and_eager_micro_batch_agree(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file,
                                           device, dtype, rel, grad_rel, loss_kernel):
    cfg = load_config(write_config(tmp_path, perturbed_actor_dir, tiny_model_dir, prompt_file))
    fused_sums, fused_grads = micro_step(cfg, perturbed_actor_dir, tiny_model_dir, device, dtype, "triton",
                                         loss_kernel)
    eager_sums, eager_grads = micro_step(cfg, perturbed_actor_dir, tiny_model_dir, device, dtype, "eager")
    assert fused_sums["positive_loss"] != 0 and fused_sums["kl_penalty_loss"] != 0
    for key, value in eager_sums.items():
        assert fused_sums[key] == pytest.approx(value, rel=rel, abs=1e-9), key
    for name, g in eager_grads.items():
        err = (fused_grads[name] - g).norm() / g.norm().clamp(min=1e-12)
        assert err <= grad_rel, f"{name}: relative gradient error {err:.3g}"
