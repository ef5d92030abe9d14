"""Command line: ``python -m oreal_fast.train CONFIG [--key value ...]``, or the same under
``torchrun --nproc_per_node N -m oreal_fast.train CONFIG ...`` for N data-parallel processes.

Overrides are parsed as python-fire parses keyword arguments (``--total_steps 90`` is an int,
``--token_level_rm None`` is None, ``--datasets '["a.jsonl","b.jsonl"]'`` a list), then type-checked
with the rest of the config. ``--smoke`` is a one-step run of the config (`SMOKE`); ``--help`` lists
every option and config key (``--help KEY`` one in full, ``oreal_fast.config_doc``) and exits 0,
before python-fire sees the command line. Every way a run can end early ends in one line on stderr,
never a traceback:
  exit 2    a bad config, or a check that can only run later (the stop word needs the tokenizer,
            the prompt files, the models, the resume state, the work_dir and its free space);
            bad prompt data. Nothing is left in work_dir.
  exit 1    a checkpoint write failed mid-run (disk full, I/O error): what is saved, how to resume.
  exit 3    a step ran out of GPU memory: the phase, the peak, the cap, the keys that would fit it
            (``oreal_fast.oom``), what is saved, how to resume.
  exit 130  SIGINT (Ctrl-C) / exit 143 SIGTERM: stopped at a safe point (``oreal_fast.interrupt``),
            saying which state is on disk and the command that continues the run.
What this module does not do: anything of the run itself, which is ``oreal_fast.trainer.train``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys

import fire

from oreal_fast.config import ConfigError, load_config
from oreal_fast.config_doc import handle_help
from oreal_fast.data.prompts import DataError
from oreal_fast.interrupt import StopRun, StopSignals
from oreal_fast.oom import StepOutOfMemory
from oreal_fast.run_dir import CheckpointWriteError

CONFIG_ERROR_EXIT = 2
WRITE_ERROR_EXIT = 1
OUT_OF_MEMORY_EXIT = 3

# --smoke: one step of the config as it is, without validation or resume states (keys given beside it win)
SMOKE = {"total_steps": 1, "val_datasets": None, "keep_resume_states": 0}
ABOUT = ("Trains with OREAL as the config file CONFIG says, from its models and prompts to its checkpoints "
         "under work_dir; the run folder is printed at start and holds the resolved config (config.py).")


@contextlib.contextmanager
def usage_errors_exit():
    """A config or data error ends the command with one line on stderr and exit 2 (train and eval)."""
    try:
        yield
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT)
    except DataError as e:
        print(f"data error: {e}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT)


def _continue_command(argv: list[str], resume_dir: str | None) -> str:
    """The command line that continues a run: the same config and overrides, ``--resume resume_dir``
    in place of any ``--resume``; with no state on disk (``resume_dir`` None), the command as given."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--resume" and resume_dir is not None:
            skip = True
        elif not (a.startswith("--resume=") and resume_dir is not None):
            args.append(a)
    if resume_dir is not None:
        args += ["--resume", resume_dir]
    return shlex.join([os.path.basename(sys.executable), "-m", "oreal_fast.train", *args])


def _run(argv: list[str], config: str, smoke: bool = False, **overrides: object) -> None:
    """Loads CONFIG with the --KEY VALUE overrides and trains.

    Args:
        config: the config file, a Python file of ``key = value`` lines (e.g. configs/demo.py).
        smoke: a short smoke run: one step of the config as it is, no validation, no resume state (the same as
            --total_steps 1 --val_datasets None --keep_resume_states 0; a key given beside it wins).
    """
    if smoke:
        overrides = {**SMOKE, **overrides}
    stop = StopSignals()
    with stop.installed():
        try:
            with usage_errors_exit():
                cfg = load_config(config, overrides)
                from oreal_fast.trainer import train  # the step loop pulls in models and kernels: load it only now

                train(cfg, stop)
        except CheckpointWriteError as e:
            print(f"checkpoint error: {e}; continue with: {_continue_command(argv, e.resume_dir)}", file=sys.stderr)
            sys.exit(WRITE_ERROR_EXIT)
        except StepOutOfMemory as e:
            print(f"\n{e}; continue with: {_continue_command(argv, e.resume_dir)}", file=sys.stderr)
            sys.exit(OUT_OF_MEMORY_EXIT)
        except StopRun as e:
            during = f"step {e.step} ({e.phase})" if e.step is not None else "start-up"
            verb = "continue" if e.resume_dir is not None else "start again"
            print(f"\n{e.name} during {during}: stopped; {e.outcome}; {verb} with: "
                  f"{_continue_command(argv, e.resume_dir)}", file=sys.stderr)
            sys.exit(e.exit_code)


def main(argv: list[str] | None = None) -> None:
    """Entry point; ``argv`` defaults to ``sys.argv[1:]``."""
    argv = sys.argv[1:] if argv is None else argv
    if handle_help(argv, "oreal_fast.train", _run, ABOUT, hidden=("argv",)):
        return
    fire.Fire(lambda config, smoke=False, **overrides: _run(argv, config, smoke, **overrides), command=argv,
              name="oreal_fast.train")


if __name__ == "__main__":
    main()
