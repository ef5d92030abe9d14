"""Command line: ``python -m oreal_fast.train CONFIG [--key value ...]``.

Overrides are parsed as python-fire parses keyword arguments (``--total_steps 90`` is an int,
``--token_level_rm None`` is None, ``--datasets '["a.jsonl","b.jsonl"]'`` a list), then type-checked
with the rest of the config. A bad config prints one line to stderr and exits with code 2, before
any model or data loads; so do the checks that can only run later (the stop word needs the
tokenizer, the prompt files are read by the trainer) and bad prompt data.
What this module does not do: anything of the run itself, which is
``oreal_fast.trainer.train``.
"""

from __future__ import annotations

import sys

import fire

from oreal_fast.config import ConfigError, load_config
from oreal_fast.data.prompts import DataError

CONFIG_ERROR_EXIT = 2


def _run(config: str, **overrides: object) -> None:
    """Loads CONFIG with the --key value overrides and trains."""
    try:
        cfg = load_config(config, overrides)
        from oreal_fast.trainer import train  # the step loop pulls in models and kernels: load it only now

        train(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT)
    except DataError as e:
        print(f"data error: {e}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT)


def main(argv: list[str] | None = None) -> None:
    """Entry point; ``argv`` defaults to ``sys.argv[1:]``."""
    fire.Fire(_run, command=sys.argv[1:] if argv is None else argv, name="oreal_fast.train")


if __name__ == "__main__":
    main()
