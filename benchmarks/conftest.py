"""Benchmarks need a CUDA GPU: on a machine without one every case is skipped at collection."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="benchmarks need a CUDA GPU")
    for item in items:
        item.add_marker(skip)
