"""Command line: ``python -m oreal_fast.eval MODEL [--preset NAME | --datasets D] [--config C] [--k N] [--out FILE]``.

Evaluates one policy on held-out problems exactly as the trainer's validation does
(``oreal_fast.evaluator``, generating through ``build_rollout``'s engine): greedy pass@1 and, with N
samples per problem, mean@N and the unbiased pass@k, each with its 95% interval, judged by the config's
judger. ``--preset`` names a standard set with its own field conventions and sampling protocol
(``eval_presets.py``: gsm8k, math500, aime24); ``--datasets`` names any other set, or, with
``--preset``, a local copy of the preset's set. MODEL is any reference ``load_decoder`` reads: a
local HF folder (a run's ``hf-N`` included), a hub id, a ``.gguf`` file or ``package://``.
Settings (chat template, stop word, sampling, judgers, seed, device, dtype) come from CONFIG, whose
``val_datasets`` is the default problem set; without a config they are the ``TrainConfig`` defaults
(the official sampling settings, the tokenizer's own template) with a rule-only math judger. A preset's
sampling protocol replaces the config's; any config key given on the command line
(``--gen_max_new 256``) replaces both. ``--max_problems`` keeps the first N problems.

Prints a Markdown table and writes JSON: the settings, the validation metrics, the estimates with their
intervals and every problem's greedy response and verdicts. The JSON goes to ``--out``, by default
beside the model (``MODEL/eval_<set>.json`` when MODEL is a writable folder) or else to
``eval_<model>_<set>.json`` in the current folder. A bad model reference, preset, config, data file or
output folder prints one line and exits with code 2, before any generation.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys

import fire

from oreal_fast.config import ConfigError, TrainConfig, config_from_values, load_config
from oreal_fast.config_doc import handle_help
from oreal_fast.data.sources import GymSource, Source, parse_sources
from oreal_fast.eval_presets import PRESETS, get_preset
from oreal_fast.evaluator import CONFIDENCE, EvalResult
from oreal_fast.progress import Progress, ProgressTicker, refresh_interval
from oreal_fast.train import usage_errors_exit

ABOUT = ("Evaluates MODEL on a standard set (--preset) or held-out problems (--datasets), through the "
         "trainer's rollout engine and judger: greedy pass@1, mean@k and unbiased pass@k with intervals.")
INTERVALS = (f"{CONFIDENCE:.0%} intervals over problems: Wilson score interval for greedy pass@1; "
             "mean +- 1.96 standard errors (clipped to [0, 1]) for mean@n and pass@k")


def settings(model: str, preset: str | None, datasets: str | list | dict | None, config: str | None,
             k: int | None, max_problems: int | None, overrides: dict[str, object]) -> TrainConfig:
    """The run's settings: CONFIG (or the defaults), then the preset's, then the flags; MODEL is the actor."""
    values = dict(overrides, actor=model)
    if k is not None:
        values["val_samples_per_problem"] = k
    if max_problems is not None:
        values["val_max_problems"] = max_problems
    if preset is not None:
        values = {**get_preset(preset).settings(_local_copy(datasets)), **values}
    elif datasets is not None:
        values["val_datasets"] = datasets
    if config is not None:
        cfg = load_config(config, values)
        if cfg.val_datasets is None:
            raise ConfigError(f"val_datasets in {config}: None, and no --preset or --datasets given: nothing to "
                              "evaluate")
        return cfg
    if "val_datasets" not in values:
        raise ConfigError(f"--preset or --datasets: one is required without --config (a preset: "
                          f"{', '.join(PRESETS)}; or a .jsonl path, a dataset id, a dict source, a list)")
    values.setdefault("datasets", values["val_datasets"])  # a config needs a training set; evaluation never reads it
    values.setdefault("judgers_config", {"math_judger": {"hosts": [], "rule_only": True,
                                                         "stop_word": values.get("stop_word", "<|im_end|>")}})
    return config_from_values(values, "oreal_fast.eval")


def _local_copy(datasets: object) -> str | None:
    if datasets is None or isinstance(datasets, str):
        return datasets
    raise ConfigError(f"--datasets with --preset is a local copy of the preset's set, one file or folder path; "
                      f"got {datasets!r}")


def evaluate_model(cfg: TrainConfig) -> EvalResult:
    """Loads ``cfg.actor`` and evaluates it on ``cfg.val_datasets`` through the training rollout engine."""
    from oreal_fast.evaluator import Evaluator
    from oreal_fast.judge import Router
    from oreal_fast.rollout import build_rollout
    from oreal_fast.runtime import build_runtime, load_chat_tokenizer, load_frozen

    runtime = build_runtime(cfg)
    tokenizer, stop_token_id = load_chat_tokenizer(cfg)
    evaluator = Evaluator.from_config(cfg, tokenizer=tokenizer, stop_token_id=stop_token_id, device=runtime.device)
    actor = load_frozen(cfg, "actor", runtime)
    num_sessions = len(evaluator.records) * max(1, cfg.val_samples_per_problem)
    progress = Progress()  # the engine adds the responses it finishes and the tokens it samples
    rollout = build_rollout(cfg, actor, compute_dtype=runtime.compute_dtype, num_sessions=num_sessions,
                            training=False, progress=progress)
    progress.start("evaluate")
    progress.expect(len(evaluator.records) * (1 + cfg.val_samples_per_problem), "responses")
    ticker = ProgressTicker(lambda: _show(progress.line()), interval=refresh_interval(sys.stderr))
    try:
        with Router(cfg.judgers_config, cfg.data_judger_mapping) as router:
            return evaluator.evaluate(rollout, router)
    finally:
        ticker.close()
        _show(progress.line(), last=True)


def _show(line: str, last: bool = False) -> None:
    """The progress line on stderr: redrawn in place on a terminal, a line each time into a file."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r{line}\033[K" + ("\n" if last else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def build_report(cfg: TrainConfig, preset: str | None, result: EvalResult) -> dict:
    """The JSON report: what was evaluated and how, the metrics and estimates, every problem's verdicts."""
    return {
        "model": cfg.actor, "preset": preset, "set": set_label(preset, cfg.val_datasets),
        "datasets": cfg.val_datasets, "config": cfg.config_path, "samples_per_problem": result.samples_per_problem,
        "sampling": {"temperature": cfg.temperature, "top_p": cfg.gen_top_p, "top_k": cfg.gen_top_k,
                     "max_new_tokens": cfg.gen_max_new, "max_length": cfg.gen_max_length, "seed": cfg.seed},
        "metrics": result.metrics(),  # the keys of a run's validation.jsonl, to compare with its rows
        "estimates": {name: dataclasses.asdict(e) for name, e in result.estimates().items()},
        "intervals": INTERVALS,
        "problems": [dataclasses.asdict(p) for p in result.problems],
    }


def format_table(report: dict) -> str:
    """A line naming the model, the set and the sampling, then the estimates as a Markdown table in percent."""
    n, s = report["samples_per_problem"], report["sampling"]
    drawn = (f"{n} samples per problem at temperature {s['temperature']:g}, top-p {s['top_p']:g}" if n
             else "greedy only")
    lines = [f"model `{report['model']}` on {report['set']} ({report['metrics']['val_num_problems']} problems): "
             f"{drawn}, up to {s['max_new_tokens']} new tokens", "",
             f"| metric | % | {CONFIDENCE:.0%} interval |", "| --- | ---: | :---: |"]
    for name, e in report["estimates"].items():
        lines.append(f"| {name} | {100 * e['value']:.1f} | [{100 * e['low']:.1f}, {100 * e['high']:.1f}] |")
    return "\n".join(lines)


def set_label(preset: str | None, val_datasets: object) -> str:
    """How file names name the problem set: the preset, else each source's file or dataset name."""
    if preset is not None:
        return preset
    return _slug("+".join(_source_name(s) for s in parse_sources(val_datasets)))


def _source_name(source: Source) -> str:
    if isinstance(source, GymSource):
        return "reasoning_gym"
    base = os.path.basename(os.path.normpath(source.path.removeprefix("package://")))
    return os.path.splitext(base)[0] if source.is_file else base


def default_out_path(model: str, label: str) -> str:
    """``MODEL/eval_<label>.json`` when MODEL is a writable folder, else ``eval_<model>_<label>.json`` here."""
    if os.path.isdir(model) and os.access(model, os.W_OK):
        return os.path.join(model, f"eval_{label}.json")
    path = os.path.normpath(model)
    if os.path.isfile(path):
        name = os.path.splitext(os.path.basename(path))[0]
    elif os.path.isdir(path):
        name = os.path.basename(path)
    elif model.startswith("package://"):  # a file inside a package: its path, less the suffix
        name = os.path.splitext(model.removeprefix("package://"))[0].replace("/", "--")
    else:  # a hub id: "Qwen/Qwen2.5-0.5B" -> "Qwen--Qwen2.5-0.5B"
        name = model.replace("/", "--")
    return f"eval_{_slug(name)}_{label}.json"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "set"


def _check_writable(out: str) -> None:
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ConfigError(f"--out {out!r}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--out {out!r}: the folder {folder!r} is not writable (name another file with --out)")


def _run(model: str, preset: str | None = None, datasets: str | list | dict | None = None, config: str | None = None,
         k: int | None = None, max_problems: int | None = None, out: str | None = None, **overrides: object) -> None:
    """Evaluates MODEL, prints the table and writes the JSON report (see the module docstring).

    Args:
        model: a local HF folder (a run's hf-N), a hub id, a .gguf file or a package:// reference.
        preset: a standard set with its sampling protocol: gsm8k | math500 | aime24.
        datasets: the problems (a .jsonl, .json or .parquet file, a dataset id or folder, a dict
            source, a list); with --preset, a local copy of the preset's set (a file or folder).
        config: a training config file; its settings and val_datasets are the defaults.
        k: samples per problem for mean@k and pass@k (val_samples_per_problem); 0 = greedy only.
        max_problems: keep only the first N problems.
        out: the JSON report's path; default beside MODEL, or named after MODEL and the set.
        **overrides: any config key, e.g. --gen_max_new 256.
    """
    with usage_errors_exit():
        cfg = settings(model, preset, datasets, config, k, max_problems, overrides)
        out = out or default_out_path(model, set_label(preset, cfg.val_datasets))
        _check_writable(out)
        report = build_report(cfg, preset, evaluate_model(cfg))
    print(format_table(report))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    """Entry point; ``argv`` defaults to ``sys.argv[1:]``."""
    argv = sys.argv[1:] if argv is None else argv
    if handle_help(argv, "oreal_fast.eval", _run, ABOUT, hidden=("actor",)):  # MODEL is the actor
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")  # what loads
    fire.Fire(_run, command=argv, name="oreal_fast.eval")


if __name__ == "__main__":
    main()
