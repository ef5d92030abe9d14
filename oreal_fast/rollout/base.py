"""The rollout interface: prompts (token ids) in, response token ids out.

`SamplingParams` carries the official generation settings (reference 4.2); `RolloutEngine` is
the protocol every engine implements (`rollout.build.build_rollout` makes the configured one);
`new_token_limits` and `finished` are the one stop rule both engines apply. Engines work on token
ids only: chat templates and decoding belong to the caller. An engine owns how it runs: eval
mode, no autograd, its compute dtype, its memory; the caller gives it nothing but prompts,
settings, a generator, after each optimiser step the actor's weights, and after each step the
step's measured peak memory.

Each generated token comes with its log-prob under the model's unmodified next-token distribution:
log_softmax of the raw logits in fp32 at temperature 1, before temperature, top-k and top-p. That
is the distribution the trainer takes the actor's log-probs under (reference 4.9: no temperature
in training; Q18: the untruncated distribution), so with the same weights the two differ only by
the engine's numerics (its weight copy, kernels and compute dtype).
Invariant: a response ends with its stop token when it stopped on one (the token is kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable, Mapping
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

    def response_logprobs(self) -> list[torch.Tensor] | None:
        """Log-probs of the last `generate` call's tokens (see the module docstring).

        Returns:
            One [len(response)] fp32 CPU tensor per response, same order; None from an engine that
            samples from no model (a scripted stand-in).
        """
        ...

    def fit_memory(self, peak_gib: Mapping[str, float]) -> None:
        """After a step: the peak allocated device memory (GiB) of each of its measured phases
        (``gen``, ``rl``). An engine that sizes its memory from what a step needs (the paged
        engine's KV pool without ``kv_cache_gib``) resizes here, between steps; others ignore it."""
        ...

    def memory_state(self) -> dict[str, int]:
        """What `fit_memory` has chosen so far (empty for an engine that sizes nothing). A resume
        state carries it: which sequences share a decode round depends on the pool's size once it
        preempts, so a resumed run must generate with the pool the straight run had."""
        ...

    def load_memory_state(self, state: Mapping[str, int]) -> None:
        """Take a `memory_state` back (an empty one, from an older resume state, changes nothing)."""
        ...

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take the actor's new weights (after an optimiser step).

        Args:
            weights: ``(name, whole tensor)`` per entry of the actor's state dict, in any dtype
                (``parallel.full_weights``: under data parallelism every rank iterates, since
                each item gathers a sharded tensor). An engine that generates with the actor's
                own parameters has nothing to copy and may leave the iterator unread.
        """
        ...

    def stats(self) -> dict[str, float]:
        """Numbers about the last `generate` call (logged as ``rollout_<name>`` in the step's metrics)."""
        ...


def check_prompts(prompts: list[list[int]], params: SamplingParams) -> None:
    """Every prompt has at least one token and room for one new token under `max_length`."""
    for i, p in enumerate(prompts):
        if not 1 <= len(p) < params.max_length:
            raise ValueError(
                f"prompt {i} has {len(p)} tokens: it must have at least 1 "
                f"and fewer than max_length={params.max_length}"
            )


def new_token_limits(prompt_lens: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """How many new tokens each response may have: min(max_new_tokens, max_length - prompt length).

    Args:
        prompt_lens: [B] int64 prompt lengths (each < max_length).

    Returns:
        [B] int64, each >= 1.
    """
    return (params.max_length - prompt_lens).clamp(max=params.max_new_tokens)


def finished(tokens: torch.Tensor, num_new: torch.Tensor, limits: torch.Tensor, stop_ids: torch.Tensor) -> torch.Tensor:
    """The stop rule of reference 4.2, checked after a sampled token is appended.

    A response ends when it has `limits` new tokens or its last token is a stop token (which is
    kept). One device op chain, no host sync.

    Args:
        tokens: [B] int64, the token just sampled for each sequence.
        num_new: [B] int64, new tokens each response holds, that token included.
        limits: [B] int64 from `new_token_limits`.
        stop_ids: [S] int64 stop token ids (S may be 0).

    Returns:
        [B] bool, True where the response is complete.
    """
    return (num_new >= limits) | torch.isin(tokens, stop_ids)
