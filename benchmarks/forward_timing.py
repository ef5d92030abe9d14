"""Wall time of a model's forward (tests/model/test_decoder_gpu.py records it beside its accuracy checks).

Not a pytest-benchmark suite: one helper that times a no-grad forward with CUDA events on a GPU
(the host timer on CPU) and returns the median.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn


def benchmark_forward(
    model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor,
    max_seqlen: int, *, warmup: int = 2, iters: int = 5,
) -> float:
    """Median wall time of one no-grad forward, in milliseconds (CUDA events on GPU)."""
    times = []
    with torch.no_grad():
        for i in range(warmup + iters):
            if input_ids.is_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(input_ids, positions, cu_seqlens, max_seqlen)
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                model(input_ids, positions, cu_seqlens, max_seqlen)
                ms = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times.append(ms)
    return sorted(times)[len(times) // 2]
