"""The `baseline` benchmark provider: one kernel module of another version of oreal_fast.

A kernel benchmark compares our kernels with the same file at an earlier commit (the start of a
piece of work) in the same run, on the same GPU. That version lives in a folder named by the
environment variable BASELINE_ROOT, holding its `oreal_fast/` package:

    git archive START_COMMIT oreal_fast | tar -x -C /tmp/base
    BASELINE_ROOT=/tmp/base pytest benchmarks/test_bench_sampling.py --benchmark-only

The file is loaded by path under a name of its own, beside the current package, so both versions
run in one process; the kernel files import only torch and triton, never the rest of the package.
Without BASELINE_ROOT the provider's cases skip.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zlib
from types import ModuleType

import pytest


def load_version_module(root: str, relative_path: str) -> ModuleType:
    """Module `relative_path` (e.g. "kernels/sampling.py") of the oreal_fast under folder `root`,
    loaded by path under a name of its own (once per process)."""
    path = os.path.join(root, "oreal_fast", relative_path)
    # one name per (folder, file): several versions of one file can run side by side
    tag = zlib.crc32(os.path.abspath(root).encode())
    name = f"baseline_{tag:08x}_" + relative_path.removesuffix(".py").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not os.path.exists(path):
        raise FileNotFoundError(f"{root} has no oreal_fast/{relative_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def baseline_module(relative_path: str) -> ModuleType:
    """Module `relative_path` of BASELINE_ROOT's oreal_fast; skips without BASELINE_ROOT."""
    root = os.environ.get("BASELINE_ROOT")
    if not root:
        pytest.skip("the baseline provider needs BASELINE_ROOT (a folder holding another commit's oreal_fast/)")
    return load_version_module(root, relative_path)
