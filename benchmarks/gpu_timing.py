"""GPU time of a function, as the sweep scripts measure it: `calls` calls captured in one CUDA graph,
the graph replayed `replays` times, each replay timed by CUDA events; the median replay over
`calls`. Launch overhead is the graph's, not the host's, so small kernels show their GPU time."""

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
