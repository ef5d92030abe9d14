#!/usr/bin/env bash
# Runs the CPU test suite (Triton kernels run in the interpreter). GPU-only tests skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
exec python3 -m pytest tests -q -ra "$@"
