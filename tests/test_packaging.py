"""The installed distribution maps kernels/ to ``oreal_fast.kernels`` and never to a top-level
``kernels`` package (that name belongs to Hugging Face's kernel hub)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import importlib.util, json
import oreal_fast.kernels as k
top = importlib.util.find_spec("kernels")
print(json.dumps({"file": k.__file__, "has_linear_logprob": hasattr(k, "linear_logprob"),
                  "top_level": None if top is None else top.origin}))
"""


def test_kernels_import_as_oreal_fast_kernels_from_outside_the_tree(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["has_linear_logprob"]
    assert os.path.basename(os.path.dirname(found["file"])) == "kernels"
    repo_kernels = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
    # a top-level `kernels`, if any is installed, must be someone else's, never our folder
    assert found["top_level"] is None or not found["top_level"].startswith(repo_kernels)
