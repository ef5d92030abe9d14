"""The rollout interface: prompts (token ids) in, response token ids out.

`SamplingParams` carries the official generation settings (reference 4.2); `RolloutEngine` is
the protocol every engine implements (the reference sampler here, the fast paged engine later).
Engines work on token ids only: chat templates and decoding to text belong to the caller.
Invariant: a response ends with its stop token when it stopped on one (the token is kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample and when to stop (official names in brackets)."""

    max_new_tokens: int  # stop once a response has this many tokens [gen_max_new]
    max_length: int  # stop once prompt + response reach this many tokens [gen_max_length]
    top_k: int = 0  # keep the k most likely tokens; 0 = off [gen_top_k]
    top_p: float = 1.0  # keep the smallest nucleus with mass >= top_p; 1.0 = off [gen_top_p]
    temperature: float = 1.0  # logits are divided by it before top-k/top-p [temperature]
    do_sample: bool = True  # False = greedy argmax [gen_do_sample]
    stop_token_ids: tuple[int, ...] = ()  # a sampled token in this set ends the response [stop_word id]

    def __post_init__(self) -> None:
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
            ("max_length", self.max_length >= 2, ">= 2"),
            ("top_k", self.top_k >= 0, ">= 0 (0 = off)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("temperature", self.temperature > 0.0, "> 0"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} = {getattr(self, name)!r}: must be {allowed}")


class RolloutEngine(Protocol):
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[list[int]]:
        """Sample one response per prompt.

        Args:
            prompts: prompt token ids, one list per session (k samples of a prompt = k entries).
            params: sampling and stop settings.
            generator: the only source of randomness (on the model's device).

        Returns:
            Response token ids per prompt, same order; the stop token is kept as the last token.
        """
        ...
