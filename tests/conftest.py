"""Suite-wide collection order: the slowest file first, so that with several workers (scripts/test.sh)
the demo's training run starts at once instead of after the rest of the suite."""

from __future__ import annotations

import os

FIRST = ("test_demo.py",)


def pytest_collection_modifyitems(items) -> None:
    items.sort(key=lambda item: os.path.basename(str(item.path)) not in FIRST)  # stable: the rest keep their order
