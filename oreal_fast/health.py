"""Health counters of the training process, read once per step: what must stay flat over a long run.

What it does: `health_counters(device, judge_workers)` returns, at the moment of the call,
``host_rss_gib`` (resident host memory now, not the peak: a peak cannot come back down, so it
hides whether memory is returned), ``open_fds`` (open file descriptors), ``judge_workers`` (live
rule-check processes, as the router reports them) and, on CUDA, ``gpu_allocated_gib`` and
``gpu_reserved_gib`` (tensors alive and the caching allocator's reserve after the step). The
step's peak GPU memory is the official ``max_memory``. Any of these growing from step to step
is a leak.

What it does not: it judges nothing (tests/trainer/test_soak.py and benchmarks/soak_report.py
compare early and late steps), and it sees only this process, not other ranks.

Invariant: reading the counters changes no state and never waits on the GPU.
"""

from __future__ import annotations

import os

import torch

# Every key `health_counters` may return. They depend on the machine and on what else runs there,
# so run comparisons leave them out (oreal_fast.metrics.reproducible_metrics).
HEALTH_KEYS = ("host_rss_gib", "open_fds", "judge_workers", "gpu_allocated_gib", "gpu_reserved_gib")


def health_counters(device: torch.device, judge_workers: int) -> dict[str, float | int | None]:
    """This process's counters now (see the module docstring).

    Args:
        device: the training device; GPU counters only when it is CUDA.
        judge_workers: live rule-check worker processes (``Router.live_workers()``).

    Returns:
        ``{key: value}`` for the keys of HEALTH_KEYS that apply; the host values are None where
        there is no /proc (they are read from Linux's /proc/self).
    """
    counters: dict[str, float | int | None] = {
        "host_rss_gib": _rss_gib(),
        "open_fds": _open_fds(),
        "judge_workers": judge_workers,
    }
    if device.type == "cuda":
        counters["gpu_allocated_gib"] = torch.cuda.memory_allocated(device) / 2**30
        counters["gpu_reserved_gib"] = torch.cuda.memory_reserved(device) / 2**30
    return counters


def _rss_gib() -> float | None:
    """Resident set size now: the second field of /proc/self/statm, in pages."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return None


def _open_fds() -> int | None:
    """Open file descriptors: the entries of /proc/self/fd, less the one that lists them."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError:
        return None
