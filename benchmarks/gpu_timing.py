"""GPU time of a function, as the sweep scripts measure it: `calls` calls captured in one CUDA graph,
the graph replayed `replays` times, each replay timed by CUDA events; the median replay over
`calls`. Launch overhead is the graph's, not the host's, so small kernels show their GPU time.
And the device-to-device copy rate the benchmarks compare memory-bound kernels with."""

from __future__ import annotations

import statistics

import torch


def graph_seconds(fn, calls: int = 20, replays: int = 7) -> float:
    """Median seconds per call of `fn` (a CUDA-graph-capturable function of no arguments)."""
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    graph.reset()
    return statistics.median(times)


def copy_gb_per_s() -> float:
    """Rate of a 1 GiB device-to-device copy, (read + write bytes) / time, in GB/s (`graph_seconds`)."""
    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / graph_seconds(lambda: dst.copy_(src), calls=4) / 1e9
