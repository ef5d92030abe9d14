"""Prompt data: sources (files, Hub datasets, reasoning-gym), records and balancing, the seeded step sampler, chat
rendering and packing."""

from oreal_fast.data.chat import render_prompt_ids
from oreal_fast.data.packing import PackedRow, pack_sequences
from oreal_fast.data.prompts import (
    DataError,
    PromptRecord,
    balance_by_difficulty,
    load_prompt_records,
    resolve_path,
)
from oreal_fast.data.sampler import PromptSampler, repeat_k, shuffle_seed_for

__all__ = [
    "DataError", "PackedRow", "PromptRecord", "PromptSampler", "balance_by_difficulty",
    "load_prompt_records", "pack_sequences", "render_prompt_ids", "repeat_k", "resolve_path",
    "shuffle_seed_for",
]
