"""Named evaluation sets for ``python -m oreal_fast.eval MODEL --preset NAME``: GSM8K test, MATH-500, AIME 2024.

A preset is a source dict of ``data/sources.py`` (where the set lives on the Hugging Face Hub, its
subset and split, its question and answer fields, how the gold answer is read) and the sampling
protocol the set is reported with (samples per problem, temperature, top-p, max new tokens). It can
point at a local copy of the set instead of the Hub (:meth:`EvalPreset.source`). What it does not
do: read rows (``data/prompts.py``), judge (the config's judgers) or score (``evaluator.py``).

Invariant: a preset is config values and nothing else (:meth:`EvalPreset.settings`), so a preset
evaluation is the evaluation those ``val_*`` and generation keys ask for, and any of them can be
overridden on the command line like any config key.

Sampling defaults, shared by the three sets: temperature 0.6 and top-p 0.95, the settings DeepSeek-R1
reports its sampled math results with (its model card: "for benchmarks requiring sampling, we use a
temperature of 0.6, a top-p value of 0.95"); greedy pass@1 uses neither. Samples per problem grow as
the set shrinks: the variance of mean@k over N problems is (spread between problems + sampling
variance within a problem / k) / N, so once k is a few samples N sets the interval. GSM8K (1319
problems) and MATH-500 (500) draw 4; AIME 2024 (30 problems, where the within-problem part still
counts) draws 32 (DeepSeek-R1 drew 64). Max new tokens: 14000 for the competition sets (max length
16384), the official trainer's generation caps, so a model is judged at the answer lengths it was
trained to write; 4096 for GSM8K (max length 6144), whose worked answers take a few hundred tokens,
so that a looping sample costs little.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oreal_fast.config import ConfigError
from oreal_fast.data.sources import LOCAL_SUFFIXES

TEMPERATURE = 0.6
TOP_P = 0.95


@dataclass(frozen=True)
class EvalPreset:
    """One standard set and its sampling protocol."""

    name: str
    title: str  # how reports name the set
    hub_source: dict[str, str] = field(repr=False)  # a dict source of data/sources.py
    samples_per_problem: int
    max_new_tokens: int
    max_length: int  # prompt + response tokens: max_new_tokens and room for a prompt with its system prompt

    def source(self, local_copy: str | None = None) -> dict[str, str]:
        """The set as a source dict: on the Hub, or with the same fields read from ``local_copy``.

        Args:
            local_copy: None (the Hub), one file of the split (``.parquet``, ``.json``, ``.jsonl``:
                read whole, so the Hub split and subset are dropped) or a folder laid out as the
                Hub repository (a clone of it: the subset and split still choose the files).
        """
        if local_copy is None:
            return dict(self.hub_source)
        source = dict(self.hub_source, path=local_copy)
        if local_copy.endswith(LOCAL_SUFFIXES):
            source.pop("split", None)
            source.pop("subset", None)
        return source

    def settings(self, local_copy: str | None = None) -> dict[str, object]:
        """The config values the preset sets: the whole set and the sampling protocol."""
        return {
            "val_datasets": self.source(local_copy),
            "val_max_problems": None,  # a config's cap on its own held-out set does not shorten the standard one
            "val_samples_per_problem": self.samples_per_problem,
            "temperature": TEMPERATURE,
            "gen_top_p": TOP_P,
            "gen_max_new": self.max_new_tokens,
            "gen_max_length": self.max_length,
        }


PRESETS: dict[str, EvalPreset] = {p.name: p for p in (
    # huggingface.co/datasets/openai/gsm8k (README): configs "main" and "socratic", splits train / test
    # (1319 test problems), fields "question" and "answer"; the answer is the worked solution followed by
    # "#### N" (as NVIDIA Megatron-Bridge's GSM8K processor docs describe it), thousands separators at times.
    EvalPreset("gsm8k", "GSM8K test", {"path": "openai/gsm8k", "subset": "main", "split": "test",
                                       "question": "question", "answer": "answer", "extract": "gsm8k"},
               samples_per_problem=4, max_new_tokens=4096, max_length=6144),
    # huggingface.co/datasets/HuggingFaceH4/MATH-500 (eval.yaml): config "default", split "test",
    # input field "problem", target field "answer" (the final answer alone, LaTeX; 500 problems).
    EvalPreset("math500", "MATH-500", {"path": "HuggingFaceH4/MATH-500", "split": "test",
                                       "question": "problem", "answer": "answer"},
               samples_per_problem=4, max_new_tokens=14000, max_length=16384),
    # huggingface.co/datasets/HuggingFaceH4/aime_2024 (README): one split "train" of 30 problems
    # (AIME I and II 2024), string fields id, problem, solution, answer, url, year.
    EvalPreset("aime24", "AIME 2024", {"path": "HuggingFaceH4/aime_2024", "split": "train",
                                       "question": "problem", "answer": "answer"},
               samples_per_problem=32, max_new_tokens=14000, max_length=16384),
)}


def get_preset(name: object) -> EvalPreset:
    """The preset called ``name``.

    Raises:
        ConfigError: no such preset; the message lists them.
    """
    if not isinstance(name, str) or name not in PRESETS:
        known = ", ".join(f"{p.name} ({p.title})" for p in PRESETS.values())
        raise ConfigError(f"--preset {name!r}: no such preset; the presets are {known}")
    return PRESETS[name]
