#!/usr/bin/env bash
# Runs the CPU test suite (Triton kernels run in the interpreter). GPU-only tests skip with a reason.
# Two worker processes, each test file whole in one of them (its module fixtures built once); the demo
# run, a third of the suite on two cores, goes first (tests/conftest.py). Extra arguments go to pytest
# (`-n 0`: one process).
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
exec python3 -m pytest tests -q -ra -n 2 --dist loadfile "$@"
