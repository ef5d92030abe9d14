"""Where one RL phase's time goes as the loop runs it (the `short` case of test_bench_rl_loop.py).

  python benchmarks/profile_rl_loop.py --out rl_loop_profile.json [--variants oreal_fast ...]

Profiles these variants with torch.profiler, each after one warm-up phase (models as the trainer
builds them on CUDA: fused trunk ops, the recompute plan for 32768-token micro-batches under 40 GiB):
  oreal_fast    varlen attention, micro-batches packed to the 32768-token budget
  trunk_eager   the same with the eager trunk ops (RMSNorm, rope, SwiGLU, residual adds)
  official_split  attention chosen for the bf16 compute dtype (varlen), 2 sequences per micro-batch
  before        what the loop ran before token budgets: fp32-master models choose attention for
                the fp32 storage dtype (per-sequence SDPA, one host sync per layer), 2 sequences
                per micro-batch
and reports, per variant: wall time, GPU-busy time (union of kernel intervals), the busy fraction,
kernel count, host syncs (cudaStreamSynchronize / cudaDeviceSynchronize / blocking D2H copies) and
the top kernels by GPU time.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rl_shapes import DEVICE, rl_models, short_case

from oreal_fast.config import TrainConfig
from oreal_fast.kernels.trunk_train import TRAIN_OPS
from oreal_fast.model.attention import make_backend, sdpa_attention
from oreal_fast.model.decoder import EAGER_OPS, TrunkOps
from oreal_fast.optimizers import clip_gradients
from oreal_fast.rl_step import RLSettings, rl_phase
from oreal_fast.runtime import Precision

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
# name -> (token budget, attention backend, trunk ops)
VARIANTS = {"oreal_fast": (32768, "varlen", TRAIN_OPS), "trunk_eager": (32768, "varlen", EAGER_OPS),
            "official_split": (0, "varlen", TRAIN_OPS), "before": (0, "sdpa", TRAIN_OPS)}


def _sdpa_reading_cu_seqlens(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host=None):
    """The "sdpa" backend as it ran before micro-batches carried host bounds: the bounds read back
    from cu_seqlens, one host sync per layer."""
    return sdpa_attention(q, k, v, cu_seqlens, max_seqlen)


def _use_backend(models, name: str) -> None:
    backend = _sdpa_reading_cu_seqlens if name == "sdpa" else make_backend(name)
    for model in (models.actor, models.token_rm.backbone):
        for block in model.blocks:
            inner = getattr(block, "_checkpoint_wrapped_module", block)
            inner.attn.backend = backend


def _busy_ms(events) -> float:
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy / 1e3


def profile_variant(name: str, budget: int, backend: str, ops: TrunkOps) -> dict:
    kept = short_case()
    models, _ = rl_models(tokens=32768, ops=ops)
    _use_backend(models, backend)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-7, fused=True) for m in (models.actor, models.token_rm)]
    cfg = TrainConfig(actor="random", datasets="none", threshold_rescale=True)
    settings = RLSettings.from_config(cfg, Precision(torch.device(DEVICE), torch.bfloat16))

    def phase():
        rl_phase(models, kept, settings, micro_batch_size=2, token_budget=budget, update_actor=True)
        for model, opt in zip((models.actor, models.token_rm), opts):
            clip_gradients(model, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    phase()
    # CUDA activity only: kernels and CUDA runtime calls (the syncs among them), not every aten op,
    # so the tens of thousands of events of the official split stay cheap to collect
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        phase()
        wall_ms = (time.perf_counter() - t0) * 1e3
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    syncs = sum(1 for e in events if e.name in SYNC_EVENTS)
    d2h = sum(1 for e in events if e.name == "cudaMemcpyAsync" and e.device_type != torch.autograd.DeviceType.CUDA)
    by_name: dict[str, float] = {}
    for k in kernels:
        by_name[k.name] = by_name.get(k.name, 0.0) + k.device_time / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    busy = _busy_ms(kernels)
    num_tokens = sum(t.num_tokens for t in kept)
    return {"variant": name, "wall_ms": wall_ms, "gpu_busy_ms": busy, "busy_fraction": busy / wall_ms,
            "tokens_per_s": num_tokens / wall_ms * 1e3, "num_kernels": len(kernels), "host_syncs": syncs,
            "memcpy_calls": d2h, "top_kernels_ms": top}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    results = []
    # ours first: a run cut short by a time limit still has it; the JSON is rewritten after each
    for name in args.variants:
        r = profile_variant(name, *VARIANTS[name])
        results.append(r)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"{r['variant']:>15}: wall {r['wall_ms']:8.1f} ms  busy {r['gpu_busy_ms']:8.1f} ms "
              f"({100 * r['busy_fraction']:4.1f} %)  {r['tokens_per_s']:8.0f} tok/s  kernels {r['num_kernels']}  "
              f"syncs {r['host_syncs']}  memcpy {r['memcpy_calls']}", flush=True)


if __name__ == "__main__":
    main()
