"""A config file of the config tests' small valid config plus the data keys a test writes.

A helper module rather than a conftest.py: tests/trainer imports its own conftest by name, and a second
non-package conftest.py loaded after it would take that name."""

import textwrap

from tests.base_config import BASE  # the config tests' small valid config; a test's own data keys come after it


def write_config(tmp_path, body: str) -> str:
    """The path of tmp_path/cfg.py, holding BASE plus ``body``."""
    path = tmp_path / "cfg.py"
    path.write_text(BASE + textwrap.dedent(body), encoding="utf-8")
    return str(path)
