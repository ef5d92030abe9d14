"""Prompt token ids from a conversation and a chat template (reference 3.3).

Same result as the official ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
with tokenize=True: the template is rendered to text (transformers' Jinja environment, with
``trim_blocks`` and ``lstrip_blocks``) and that text is encoded **without** added special tokens,
so a BOS token appears only if the template writes one. `encode_prompt` adds the one check a
prompt needs before generation: room for a response.
"""

from __future__ import annotations

from typing import Any

from oreal_fast.data.prompts import DataError, PromptRecord


def render_prompt_ids(tokenizer: Any, chat_template: str | None, message_data: list[dict[str, str]]) -> list[int]:
    """Renders a conversation and encodes it.

    Args:
        tokenizer: a transformers tokenizer.
        chat_template: Jinja template; None = the tokenizer's own.
        message_data: [{"role": ..., "content": ...}, ...].

    Returns:
        Prompt token ids, ending with the generation prompt (e.g. ``<|im_start|>assistant\\n``).
    """
    text = tokenizer.apply_chat_template(
        message_data, chat_template=chat_template, tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def encode_prompt(tokenizer: Any, chat_template: str | None, record: PromptRecord, max_length: int,
                  what: str = "a prompt") -> list[int]:
    """``render_prompt_ids`` of a record, which must leave room for one new token under ``max_length``.

    Raises:
        DataError: naming the prompt (``what``, e.g. "a held-out prompt") and how to fix it.
    """
    ids = render_prompt_ids(tokenizer, chat_template, record.message_data)
    if len(ids) >= max_length:
        raise DataError(f"{what} has {len(ids)} tokens, not less than gen_max_length={max_length}; "
                        f"raise gen_max_length or drop the prompt: {record.question[:80]!r}")
    return ids
