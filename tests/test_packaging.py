"""The kernels import as ``oreal_fast.kernels`` and nothing of ours is a top-level ``kernels``:
that name belongs to Hugging Face's kernel hub, which transformers imports. The README runs
``python -m oreal_fast.train`` from the checkout root, where the checkout is on ``sys.path``, so
a ``kernels/`` folder there would shadow the hub package and break every model load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import importlib.util, json
import oreal_fast.kernels as k
top = importlib.util.find_spec("kernels")
print(json.dumps({"file": k.__file__, "has_linear_logprob": hasattr(k, "linear_logprob"),
                  "top_level": None if top is None else top.origin}))
"""


@pytest.mark.parametrize("where", ["checkout_root", "elsewhere"])
def test_kernels_import_only_as_oreal_fast_kernels(where, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cwd = REPO if where == "checkout_root" else tmp_path  # `python -c` puts cwd on sys.path, as `-m` does
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["has_linear_logprob"]
    assert os.path.dirname(found["file"]) == os.path.join(REPO, "oreal_fast", "kernels")
    # a top-level `kernels`, if any is installed, must be someone else's, never a folder of ours
    assert found["top_level"] is None or not found["top_level"].startswith(REPO + os.sep)


def test_transformers_configs_load_from_the_checkout_root():
    """What the demo's first model load does (transformers 5 imports the hub's ``kernels``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "from transformers import LlamaConfig, Qwen2Config; print(LlamaConfig().model_type)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "llama"
