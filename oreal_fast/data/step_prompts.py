"""The run's training prompts (reference 3.1-3.5): read and balanced once, dealt per step, rendered once.

`load_training_records` reads the prompt records and applies the difficulty balancing; it needs no
tokenizer, so a run reads (and checks) its data before anything else loads. `PromptSource` builds
the seeded sampler over those records, and for a step returns this rank's share of the step's
prompts (every ``world_size``-th one, reference 3.4), each repeated k times (3.5), with their
prompt token ids. Not here: the held-out problems (``evaluator``), generation.

Invariant: a record's prompt ids are rendered once per run and every prompt leaves room for one
new token under ``gen_max_length`` (a longer one is a DataError naming it).
"""

from __future__ import annotations

import logging
from typing import Any

from oreal_fast.config import TrainConfig
from oreal_fast.data.chat import encode_prompt
from oreal_fast.data.prompts import DataError, PromptRecord, balance_by_difficulty, load_prompt_records
from oreal_fast.data.sampler import PromptSampler, repeat_k
from oreal_fast.parallel import DataParallel

log = logging.getLogger("oreal_fast")


def load_training_records(cfg: TrainConfig) -> list[PromptRecord]:
    """The records of ``datasets`` (the first ``max_prompts``), difficulty-balanced (3.1, 3.2); one log
    line says how many.

    Raises:
        DataError: unreadable data, a record without pass_rate while balancing is on, or nothing
            left after difficulty balancing.
    """
    records = load_prompt_records(cfg.datasets, max_prompts=cfg.max_prompts)
    balanced = balance_by_difficulty(records, cfg.data_difficulty_balance_cfg)
    if not balanced:
        raise DataError(
            f"datasets {cfg.datasets!r}: no prompt to train on ({len(records)} records read, "
            f"none left after difficulty balancing with {cfg.data_difficulty_balance_cfg})"
        )
    how = f"{len(balanced)} after difficulty balancing" if cfg.data_difficulty_balance_cfg else "no balancing"
    log.info(f"prompts: {len(records)} records ({how})")
    return balanced


class PromptSource:
    """Balanced prompt records (`load_training_records`), the seeded sampler over them and their prompt ids."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any, records: list[PromptRecord]) -> None:
        self.records = records
        self.sampler = PromptSampler(len(self.records), cfg.gen_global_batch // cfg.prompt_repeat_k, cfg.seed)
        self.tokenizer, self.chat_template = tokenizer, cfg.chat_template
        self.max_length, self.k = cfg.gen_max_length, cfg.prompt_repeat_k
        self._prompt_ids: dict[int, list[int]] = {}

    def step_prompts(self, step: int, dp: DataParallel) -> tuple[list[PromptRecord], list[list[int]]]:
        """This rank's share of step ``step``'s prompts, each repeated k times, and their token ids."""
        records = repeat_k([self.records[i] for i in dp.strided(self.sampler.batch(step))], self.k)
        return records, [self._ids(r) for r in records]

    def _ids(self, record: PromptRecord) -> list[int]:
        key = id(record)
        if key not in self._prompt_ids:
            self._prompt_ids[key] = encode_prompt(self.tokenizer, self.chat_template, record, self.max_length)
        return self._prompt_ids[key]
