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


@pytest.fixture
def fp32_gemm_sums():
    """The twins' GEMMs sum in fp32 throughout, as the kernels do (cuBLAS may otherwise add bf16
    split-K partials in bf16). Saved and restored by hand: the setting is a property of torch's
    cuBLAS module, which pytest's monkeypatch (9.2) cannot restore."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    yield
    matmul.allow_bf16_reduced_precision_reduction = saved
