"""Command line: ``python -m oreal_fast.eval MODEL [--datasets D] [--config CONFIG] [--k N] [--out FILE]``.

Evaluates one policy on held-out problems exactly as the trainer's validation does
(``oreal_fast.evaluator``): greedy pass@1 and, with ``--k N``, sampled pass@1 and pass@N from N
samples per problem, judged by the config's judger. MODEL is any reference ``load_decoder`` reads:
a local HF folder (a run's ``hf-N`` included), a hub id, a ``.gguf`` file or ``package://``.
Settings (chat template, stop word, sampling, judgers, seed, device, dtype) come from CONFIG, whose
``val_datasets`` is the default problem set; without a config they are the ``TrainConfig`` defaults
(the official sampling settings, the tokenizer's own template) with a rule-only math judger. Any
config key can be overridden as in ``oreal_fast.train`` (``--gen_max_new 256``);
``--max_problems`` keeps the first N problems.

Prints a table and writes JSON (``--out``, default ``eval_results.json``): the settings, the
metrics and every problem's greedy response and verdicts. A bad model reference, config or data
file prints one line and exits with code 2, before any generation.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import fire

from oreal_fast.config import ConfigError, TrainConfig, config_from_values, load_config
from oreal_fast.config_doc import handle_help
from oreal_fast.train import usage_errors_exit


ABOUT = ("Evaluates MODEL on held-out problems as the trainer's validation does, through the same rollout "
         "engine and judger: greedy pass@1 and, with --k N, sampled pass@1 and pass@N.")


def settings(model: str, datasets: str | list[str] | None, config: str | None, k: int | None,
             max_problems: int | None, overrides: dict[str, object]) -> TrainConfig:
    """The run's settings: CONFIG (or the defaults) with MODEL as actor and the flags applied."""
    values = dict(overrides, actor=model)
    if datasets is not None:
        values["val_datasets"] = datasets
    if k is not None:
        values["val_samples_per_problem"] = k
    if max_problems is not None:
        values["val_max_problems"] = max_problems
    if config is not None:
        cfg = load_config(config, values)
        if cfg.val_datasets is None:
            raise ConfigError(f"val_datasets in {config}: None, and no --datasets given: nothing to evaluate")
        return cfg
    if datasets is None:
        raise ConfigError("--datasets: required without --config (one .jsonl path, a dataset id, or a list)")
    values.setdefault("datasets", datasets)  # a config needs a training set; evaluation never reads it
    values.setdefault("judgers_config", {"math_judger": {"hosts": [], "rule_only": True,
                                                         "stop_word": values.get("stop_word", "<|im_end|>")}})
    return config_from_values(values, "oreal_fast.eval")


def evaluate_model(cfg: TrainConfig) -> dict:
    """Loads ``cfg.actor``, evaluates it on ``cfg.val_datasets``; returns the JSON report."""
    from oreal_fast.evaluator import Evaluator
    from oreal_fast.judge import Router
    from oreal_fast.rollout import build_rollout
    from oreal_fast.runtime import build_runtime, load_chat_tokenizer, load_frozen

    runtime = build_runtime(cfg)
    tokenizer, stop_token_id = load_chat_tokenizer(cfg)
    evaluator = Evaluator.from_config(cfg, tokenizer=tokenizer, stop_token_id=stop_token_id, device=runtime.device)
    actor = load_frozen(cfg, "actor", runtime)
    num_sessions = len(evaluator.records) * max(1, cfg.val_samples_per_problem)
    rollout = build_rollout(cfg, actor, compute_dtype=runtime.compute_dtype, num_sessions=num_sessions,
                            training=False)
    with Router(cfg.judgers_config, cfg.data_judger_mapping) as router:
        result = evaluator.evaluate(rollout, router)
    return {
        "model": cfg.actor, "datasets": cfg.val_datasets, "config": cfg.config_path,
        "samples_per_problem": result.samples_per_problem, "metrics": result.metrics(),
        "problems": [dataclasses.asdict(p) for p in result.problems],
    }


def format_table(report: dict) -> str:
    """The metrics as aligned ``name  value`` lines under a header naming the model."""
    n = report["samples_per_problem"]
    names = {"val_num_problems": "problems", "val_greedy_pass1": "greedy pass@1",
             "val_sampled_pass1": f"sampled pass@1 (n={n})", "val_pass_at_k": f"pass@{n}"}
    rows = [(names[k], f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in report["metrics"].items()]
    width = max(len(name) for name, _ in rows)
    return "\n".join([f"model {report['model']}"] + [f"  {name:<{width}}  {value}" for name, value in rows])


def _run(model: str, datasets: str | list[str] | None = None, config: str | None = None, k: int | None = None,
         max_problems: int | None = None, out: str = "eval_results.json", **overrides: object) -> None:
    """Evaluates MODEL; see the module docstring. ``--help`` lists these arguments and the config keys.

    Args:
        model: the policy: a local HF folder (a run's hf-N), a hub id, a .gguf file or package://.
        datasets: the problems, in any form of the datasets key (a .jsonl path, a dataset id, a list);
            default: the config's val_datasets (required without --config).
        config: a training config whose settings (chat template, stop word, sampling, judgers, seed,
            device, dtype) the evaluation uses; default: the config defaults with a rule-only math judger.
        k: N samples per problem for sampled pass@1 and pass@N; default: greedy pass@1 only.
        max_problems: keep the first N problems; default: all.
        out: the JSON report (settings, metrics, every problem's responses and verdicts).
    """
    with usage_errors_exit():
        report = evaluate_model(settings(model, datasets, config, k, max_problems, overrides))
    print(format_table(report))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    """Entry point; ``argv`` defaults to ``sys.argv[1:]``."""
    argv = sys.argv[1:] if argv is None else argv
    if handle_help(argv, "oreal_fast.eval", _run, ABOUT, hidden=("actor",)):  # MODEL is the actor
        return
    fire.Fire(_run, command=argv, name="oreal_fast.eval")


if __name__ == "__main__":
    main()
