"""The trainer's device comes with its index: torch.cuda's memory queries and caps
(`get_per_process_memory_fraction`, `set_per_process_memory_fraction`) refuse a bare "cuda", and the
paged engine sizes its pool with them."""

import torch

from oreal_fast.trainer import resolve_device


def test_cuda_device_carries_its_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert resolve_device("auto") == torch.device("cuda", 3)
    assert resolve_device("cuda") == torch.device("cuda", 3)


def test_cpu_stays_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
