"""Prompt token ids from a conversation and a chat template (reference 3.3).

Same result as the official ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
with tokenize=True: the template is rendered to text (transformers' Jinja environment, with
``trim_blocks`` and ``lstrip_blocks``) and that text is encoded **without** added special tokens,
so a BOS token appears only if the template writes one.
"""

from __future__ import annotations

from typing import Any


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
