"""A small valid config file around the data keys a test writes (the data tests' config checks).

A helper module rather than a conftest.py: tests/trainer imports its own conftest by name, and a second
non-package conftest.py loaded after it would take that name."""

import textwrap

BASE = textwrap.dedent("""
    actor = "some/model"
    gen_global_batch = 16
    prompt_repeat_k = 4
    gen_max_new = 64
    gen_max_length = 256
    total_steps = 4
    warmup_steps = 1
    judgers_config = dict(math_judger=dict(hosts=[], rule_only=True))
""")


def write_config(tmp_path, body: str) -> str:
    """The path of tmp_path/cfg.py, holding BASE plus ``body``."""
    path = tmp_path / "cfg.py"
    path.write_text(BASE + textwrap.dedent(body), encoding="utf-8")
    return str(path)
