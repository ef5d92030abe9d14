"""``--help`` of both commands, ``--help KEY``, the generated docs/config.md and the resolved config file,
each checked against the config dataclass and the commands' own signatures (never a copied list)."""

import dataclasses
import inspect
import os
import re
import subprocess
import sys

import pytest

from oreal_fast import eval as eval_cli
from oreal_fast import train as train_cli
from oreal_fast.config import TrainConfig, load_config
from oreal_fast.config_doc import config_file_text, config_keys, markdown

from base_config import ROOT

FIELDS = [f for f in dataclasses.fields(TrainConfig) if f.name != "config_path"]  # the loader sets config_path


def _help(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--help", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def _groups_in_source() -> dict[str, str]:
    """field -> the ``# --- group ---`` comment above it in config.py, read line by line."""
    with open(os.path.join(ROOT, "oreal_fast", "config.py"), encoding="utf-8") as f:
        source = f.read()
    body = source.split("class TrainConfig:", 1)[1].split("\n    def ", 1)[0]
    groups, group = {}, None
    for line in body.splitlines():
        m = re.match(r"\s+# --- (.+) ---$", line)
        group = m.group(1) if m else group
        m = re.match(r"    (\w+): ", line)
        if m:
            groups[m.group(1)] = group
    return groups


def _listing(text: str) -> dict[str, tuple[str, str]]:
    """``--name`` lines of a --help listing -> (the group heading above, the line)."""
    entries, heading = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            heading = line
        m = re.match(r"  --(\w+)  ", line)
        if m:
            entries[m.group(1)] = (heading, line)
    return entries


def test_train_help_exits_0_and_lists_every_key_in_its_group_with_its_default():
    run = _help("oreal_fast.train")
    assert run.returncode == 0, run.stderr
    listing = _listing(run.stdout)
    groups = _groups_in_source()
    assert set(listing) == {f.name for f in FIELDS} | {"smoke"}
    for f in FIELDS:
        heading, line = listing[f.name]
        assert heading.lower() == groups[f.name].lower(), f.name
        if f.default is not dataclasses.MISSING and f.default is not None:
            assert f"(default {f.default!r})" in line, line
    assert "(not described" not in run.stdout
    # allowed values come from the loader's own tables
    assert "  --dtype  auto | bf16 | fp16 | fp32  (default 'auto')" in run.stdout
    assert "  --prompt_repeat_k  int >= 2  (default 16)" in run.stdout
    assert "  --actor  str  (required)" in run.stdout
    assert "  --reference  str | None  (default the value of actor)" in run.stdout


def test_eval_help_lists_its_own_arguments_and_the_config_keys_it_takes():
    run = _help("oreal_fast.eval")
    assert run.returncode == 0, run.stderr
    params = inspect.signature(eval_cli._run).parameters.values()
    own = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert own[0] == "model" and f"usage: python -m oreal_fast.eval MODEL " in run.stdout
    listing = _listing(run.stdout)
    # MODEL is the actor; a parameter of the command takes over the key of its name (--datasets)
    assert set(listing) == set(own[1:]) | {f.name for f in FIELDS if f.name not in own and f.name != "actor"}
    assert "(not described" not in run.stdout


def test_help_key_shows_one_key_in_full():
    run = _help("oreal_fast.train", "rl_micro_batch_tokens")
    assert run.returncode == 0
    text = " ".join(run.stdout.split())
    assert text.startswith("--rl_micro_batch_tokens (group: RL phase and optimisers")
    assert "allowed: int >= 0 default: 32768" in text
    assert "32768 = 2 x 16384" in text  # a later sentence of the docstring, beyond the listing's summary
    for form in (["--help=total_steps"], ["--help", "--total_steps"]):
        run = subprocess.run([sys.executable, "-m", "oreal_fast.train", *form], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
        assert run.returncode == 0 and run.stdout.startswith("--total_steps  (group: RL phase")
    smoke = _help("oreal_fast.train", "smoke")
    assert smoke.returncode == 0 and "--total_steps 1 --val_datasets None --keep_resume_states 0" in smoke.stdout
    compat = _help("oreal_fast.train", "tp_size")
    assert "it has no effect here (tensor parallelism" in " ".join(compat.stdout.split())


def test_help_of_an_unknown_key_is_one_line_and_exit_2():
    run = _help("oreal_fast.train", "total_stepz")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip() == ("oreal_fast.train: --help total_stepz: no such option or config key; did you mean "
                                  "'total_steps'? (--help alone lists them all)")
    run = _help("oreal_fast.eval", "actor")  # MODEL is eval's actor
    assert run.returncode == 2 and "no such option or config key" in run.stderr


def test_every_command_argument_is_described():
    for command, hidden in ((train_cli._run, {"argv"}), (eval_cli._run, set())):
        params = [p.name for p in inspect.signature(command).parameters.values()
                  if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in hidden]
        doc = inspect.getdoc(command)
        assert all(re.search(rf"^    {name}: \S", doc, re.M) for name in params), (command.__module__, params)


def test_docs_config_md_is_the_generated_page():
    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == markdown(), "docs/config.md is stale: python -m oreal_fast.config_doc > docs/config.md"
    for f in FIELDS:
        assert f"| `{f.name}` |" in committed


def test_a_field_without_a_docstring_is_an_error(monkeypatch):
    import oreal_fast.config_doc as doc

    @dataclasses.dataclass
    class Undocumented:
        documented: int = 1
        """Has one."""
        bare: int = 2

    monkeypatch.setattr(doc, "TrainConfig", Undocumented)
    config_keys.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="Undocumented.bare has no docstring"):
            doc.config_keys()
    finally:
        config_keys.cache_clear()


@pytest.mark.parametrize("name", ["demo.py", "a100_40g.py", "oreal_7b.py"])
def test_the_resolved_config_file_loads_back_to_the_same_config(tmp_path, name):
    cfg = load_config(os.path.join(ROOT, "configs", name), {"total_steps": 3, "seed": 5})
    path = tmp_path / "config.py"
    path.write_text(config_file_text(cfg, "a test"), encoding="utf-8")
    again = load_config(str(path))
    assert {**again.to_dict(), "config_path": None} == {**cfg.to_dict(), "config_path": None}
    assert (again.total_steps, again.seed) == (3, 5)
    assert len([line for line in path.read_text().splitlines() if " = " in line and not line.startswith("#")]) == \
        len(FIELDS)
