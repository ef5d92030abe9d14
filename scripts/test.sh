#!/usr/bin/env bash
# Runs the CPU test suite (Triton kernels run in the interpreter). GPU-only tests skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
# -P: the repo root stays off sys.path, so `kernels` is only ever importable as oreal_fast.kernels
exec python3 -P -m pytest tests -q -ra "$@"
