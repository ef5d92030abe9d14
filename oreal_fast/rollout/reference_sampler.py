"""A simple, correct KV-cache sampler on our Decoder: the reference every faster engine must match.

Sessions are taken `max_batch_size` at a time. Each batch: one packed prefill of all prompts
(writing a contiguous KV cache, one row per session), then one-token decode steps for the sessions
still running. Stop rule per session, checked after appending the sampled token (reference 4.2):
new tokens >= max_new_tokens, or prompt + new tokens >= max_length, or the token is a stop token
(kept as the last response token). Not here: paged memory, continuous batching, CUDA graphs,
prefix sharing between the k samples of a prompt (the fast engine's job).
Invariant: responses come back in prompt order, whatever order sessions finish in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oreal_fast.model.decoder import Decoder
from oreal_fast.rollout.base import SamplingParams
from oreal_fast.rollout.sampling import sample_next_token


class ReferenceSampler:
    """Implements `RolloutEngine` with the plain KV-cache path of `Decoder.forward`."""

    def __init__(self, model: Decoder, *, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError(f"ReferenceSampler.max_batch_size = {max_batch_size}: must be >= 1")
        self.model = model
        self.max_batch_size = max_batch_size

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[list[int]]:
        """Sample one response per prompt (see `RolloutEngine.generate`)."""
        for i, p in enumerate(prompts):
            if not 1 <= len(p) < params.max_length:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens: it must have at least 1 "
                    f"and fewer than max_length={params.max_length}"
                )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = []
                for start in range(0, len(prompts), self.max_batch_size):
                    out += self._generate_batch(prompts[start : start + self.max_batch_size], params, generator)
        finally:
            self.model.train(was_training)
        return out

    def _next_tokens(self, hidden: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> list[int]:
        """hidden: [B, H] last-position states -> sampled ids (logits in the model dtype, as the reference)."""
        logits = F.linear(hidden, self.model.lm_head_weight)  # (B, V)
        return sample_next_token(logits, params, generator).tolist()

    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[list[int]]:
        device = self.model.embed.weight.device
        lens = [len(p) for p in prompts]
        limits = [min(params.max_new_tokens, params.max_length - n) for n in lens]  # new tokens allowed
        cache = self.model.allocate_kv_cache(len(prompts), max(n + m for n, m in zip(lens, limits)))
        stop_ids = set(params.stop_token_ids)

        ids = torch.tensor([t for p in prompts for t in p], device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lens])
        cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
        rows = torch.arange(len(prompts), device=device)
        hidden = self.model(ids, positions, cu, max(lens), kv_cache=cache, cache_rows=rows)
        tokens = self._next_tokens(hidden[cu[1:].long() - 1], params, generator)

        responses: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        while True:
            for i, tok in zip(live, tokens):
                responses[i].append(tok)
            live_tokens = [(i, t) for i, t in zip(live, tokens)
                           if len(responses[i]) < limits[i] and t not in stop_ids]
            if not live_tokens:
                return responses
            live = [i for i, _ in live_tokens]
            step_ids = torch.tensor([t for _, t in live_tokens], device=device)
            step_pos = torch.tensor([lens[i] + len(responses[i]) - 1 for i in live], device=device)
            step_cu = torch.arange(len(live) + 1, device=device, dtype=torch.int32)
            step_rows = torch.tensor(live, device=device)
            hidden = self.model(step_ids, step_pos, step_cu, 1, kv_cache=cache, cache_rows=step_rows)
            tokens = self._next_tokens(hidden, params, generator)
