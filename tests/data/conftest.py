"""A small valid config file around the data keys a test writes (the data tests' config checks)."""

import textwrap

import pytest

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


@pytest.fixture
def write_config(tmp_path):
    """body -> the path of tmp_path/cfg.py holding BASE plus body."""
    def write(body: str) -> str:
        path = tmp_path / "cfg.py"
        path.write_text(BASE + textwrap.dedent(body), encoding="utf-8")
        return str(path)

    return write
