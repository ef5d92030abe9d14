"""``merged_projections`` on a CUDA GPU as the trainer runs it (fp32 masters under bf16 autocast, the
fused trunk ops, varlen attention, the Triton LM-head kernels): a phase with q/k/v and gate/up merged
against one with the weights cast once but the projections separate, and no host sync with merging.
Models, trajectories and phase are those of test_rl_phase_gpu.py.

Tolerance: the merged GEMMs run other cuBLAS kernels (another width, another split of the sums)
and their input gradients sum all output columns in one accumulator where autograd adds three (two)
bf16 results, so both the forward and the backward differ by bf16 round-off; through 4 layers and
the LM head that is the TRAIN_OPS-against-eager budget of test_rl_phase_gpu.py for the sums (rel
2e-2). Each master's gradient agrees to rel 5e-2 in L2 norm (on CPU, 3 layers, the worst is 1.6e-2:
tests/test_cast_once.py); a gradient part lost or given to the wrong master is off by order one.
"""

from __future__ import annotations

import pytest
import torch

from test_rl_phase_gpu import _grads, _models, _phase

from oreal_fast.kernels.trunk_train import TRAIN_OPS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the RL phase on a GPU needs CUDA")


def test_merged_projections_give_the_masters_the_gradients_of_separate_ones():
    results = []
    for merged in (False, True):
        models = _models(TRAIN_OPS)
        sums = _phase(models, weights_cast_once=True, merged_projections=merged)
        results.append((torch.stack(list(sums)).double(), _grads(models)))
    (ref_sums, ref_grads), (sums, grads) = results
    assert torch.allclose(sums, ref_sums, rtol=2e-2, atol=1e-6), (sums, ref_sums)
    errors = {name: float((grads[name].double() - g.double()).norm() / g.double().norm().clamp_min(1e-30))
              for name, g in ref_grads.items()}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 5e-2, f"{worst}: relative L2 error {errors[worst]:.2e}"


def test_a_merged_phase_makes_no_host_sync():
    models = _models(TRAIN_OPS)
    _phase(models, weights_cast_once=True, merged_projections=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sums = _phase(models, weights_cast_once=True, merged_projections=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(torch.stack(list(sums))).all()
