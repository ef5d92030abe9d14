"""Shared fixtures of the kernel tests: where the Triton path can run, and a poisoned allocator."""

from __future__ import annotations

import os
from typing import Callable

import pytest
import torch


@pytest.fixture
def device() -> str:
    """cpu under TRITON_INTERPRET=1, else cuda; skip where the Triton kernels cannot run."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("needs TRITON_INTERPRET=1 on CPU or a CUDA GPU")


def _poison_cuda_allocator() -> None:
    big = torch.full((2**31,), float("nan"), device="cuda")  # 8 GiB: the large-block pool
    small = [torch.full((2**17,), float("nan"), device="cuda") for _ in range(64)]
    del big, small


@pytest.fixture
def poison_cuda_allocator() -> Callable[[], None]:
    """A function that fills the CUDA caching allocator's free blocks with NaN; call it after the
    inputs exist, so outputs a kernel leaves unwritten show up as NaN, not as stale values."""
    return _poison_cuda_allocator
