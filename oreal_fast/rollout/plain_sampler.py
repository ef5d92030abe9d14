"""A plain KV-cache sampler on our Decoder: the CPU path, and the oracle the fast engine must match.

Sessions are taken `max_batch_size` at a time. Each batch: one packed prefill of all prompts
(writing a contiguous KV cache, one row per session, in the compute dtype), then one-token decode
steps for the sessions still running, under the stop rule of `base.finished`. Each sampled token's
log-prob is log_softmax of the step's logits (in fp32, temperature 1, unfiltered) at the token,
kept on the device until the batch ends. Not here: paged memory, continuous batching, CUDA
graphs, prefix sharing (the paged engine's job).
Invariant: responses come back in prompt order, whatever order sessions finish in.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F

from oreal_fast.kernels.sampling import token_logprobs_eager
from oreal_fast.model.decoder import Decoder
from oreal_fast.parallel import full_weights, load_weights
from oreal_fast.progress import Progress
from oreal_fast.rollout.base import SamplingParams, check_prompts, finished, new_token_limits
from oreal_fast.rollout.sampling import sample_next_token


class ContiguousKVCache:
    """One row of `max_length` slots per session: k, v [num_layers, rows, max_length, Hkv, D].

    The token at position p of the session in row r lives at [layer, r, p]. Slots past a session's
    length hold stale values and are masked out by position, never by a separate length counter.
    """

    def __init__(self, model: Decoder, num_rows: int, max_length: int, dtype: torch.dtype) -> None:
        c, device = model.config, model.embed.weight.device
        shape = (c.num_layers, num_rows, max_length, c.num_kv_heads, c.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def view(self, rows: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor) -> "ContiguousCacheView":
        """The cache as one forward of sequences in `rows` at `positions` sees it."""
        return ContiguousCacheView(self, rows, positions, cu_seqlens)


class ContiguousCacheView:
    """Implements `AttentionCache` for one forward: rows [N] int64 (cache row of each packed
    sequence), positions [T] int64 (absolute), cu_seqlens [N+1] int32."""

    def __init__(self, cache: ContiguousKVCache, rows: torch.Tensor, positions: torch.Tensor,
                 cu_seqlens: torch.Tensor) -> None:
        self.cache, self.rows, self.positions = cache, rows, positions
        self.bounds = cu_seqlens.tolist()  # host ints: this path loops over sequences anyway
        self.token_rows = rows.repeat_interleave(cu_seqlens.diff(), output_size=positions.shape[0])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v at their slots, then attend each query to its session's slots 0..position."""
        ck, cv = self.cache.k[layer], self.cache.v[layer]  # (rows, S, Hkv, D)
        if k.dtype != ck.dtype:
            raise TypeError(f"KV cache holds {ck.dtype} but attention got k/v in {k.dtype}")
        ck[self.token_rows, self.positions] = k
        cv[self.token_rows, self.positions] = v
        if len(self.bounds) - 1 == self.positions.shape[0]:  # decode: one token per session, one batched call
            return _attend_rows(q.unsqueeze(1), ck, cv, self.rows, self.positions[:, None]).squeeze(1)
        outs = []
        for i, (start, end) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            pos = self.positions[start:end]
            outs.append(_attend_rows(q[None, start:end], ck, cv, self.rows[i : i + 1], pos[None]).squeeze(0))
        return torch.cat(outs, dim=0)


def _attend_rows(q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor, rows: torch.Tensor,
                 q_pos: torch.Tensor) -> torch.Tensor:
    """q: [B, n, Hq, D]; ck, cv: [rows, S, Hkv, D]; rows: [B]; q_pos: [B, n] -> [B, n, Hq, D]."""
    num_keys = int(q_pos.max()) + 1
    # gather only the filled prefix of each row
    k, v = ck[:, :num_keys][rows], cv[:, :num_keys][rows]  # (B, num_keys, Hkv, D)
    # query at position p sees keys 0..p of its own row
    mask = torch.arange(num_keys, device=q.device)[None, None, :] <= q_pos[:, :, None]  # (B, n, S)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None], enable_gqa=True
    )
    return out.transpose(1, 2)


class PlainSampler:
    """Implements `RolloutEngine` with a contiguous KV cache and one decode forward per token.

    Args:
        actor: the model that generates.
        max_batch_size: sessions decoded together.
        compute_dtype: the dtype the forwards compute in and the KV cache holds (default the
            actor's parameter dtype). Fp32 masters on CUDA with a lower compute dtype run under
            autocast, as the RL phase does.
        own_copy: generate with a whole copy of the actor in ``compute_dtype``, refreshed by
            ``sync_weights``, instead of the actor's own parameters. Needed under data parallelism:
            a sharded actor's forward is a collective, and ranks decode different numbers of steps.
            It costs one unsharded model per rank (2 bytes per parameter in bf16).
        progress: gets the responses finished and tokens sampled after every forward (from the
            host values each decode step reads anyway).
    """

    def __init__(self, actor: Decoder, *, max_batch_size: int, compute_dtype: torch.dtype | None = None,
                 own_copy: bool = False, progress: Progress | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError(f"PlainSampler.max_batch_size = {max_batch_size}: must be >= 1")
        self.max_batch_size = max_batch_size
        self.kv_dtype = compute_dtype or actor.embed.weight.dtype
        self.own_copy = own_copy
        self.model = actor
        if own_copy:
            self.model = Decoder(actor.config, attn_backend="auto", device=actor.embed.weight.device,
                                 dtype=self.kv_dtype).requires_grad_(False)
            self.sync_weights(full_weights(actor))
        self.device = self.model.embed.weight.device
        # as the RL phase's forwards: autocast on CUDA to any compute dtype below fp32
        self._autocast = self.device.type == "cuda" and self.kv_dtype != torch.float32
        self._stats: dict[str, float] = {}
        self.progress = progress or Progress()
        self._logprobs: list[torch.Tensor] = []

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's weights into the own copy; without one the actor's parameters are
        already the new weights and ``weights`` is left unread."""
        if self.own_copy:
            load_weights(self.model, weights)

    def fit_memory(self, peak_gib: Mapping[str, float]) -> None:
        """Nothing to resize: the batch is sized once, at build (see `RolloutEngine.fit_memory`)."""

    def memory_state(self) -> dict[str, int]:
        return {}  # nothing sized from measured steps

    def load_memory_state(self, state: Mapping[str, int]) -> None:
        pass

    def stats(self) -> dict[str, float]:
        """New tokens, seconds and tokens per second of the last `generate` call."""
        return dict(self._stats)

    def response_logprobs(self) -> list[torch.Tensor]:
        """Log-probs of the last `generate` call's tokens (see `RolloutEngine.response_logprobs`)."""
        return self._logprobs

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[list[int]]:
        """Sample one response per prompt (see `RolloutEngine.generate`)."""
        check_prompts(prompts, params)
        t0 = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        autocast = torch.autocast(self.device.type, dtype=self.kv_dtype, enabled=self._autocast)
        try:
            with torch.no_grad(), autocast:
                out, logprobs = [], []
                for start in range(0, len(prompts), self.max_batch_size):
                    batch_out, batch_logprobs = self._generate_batch(prompts[start : start + self.max_batch_size],
                                                                     params, generator)
                    out += batch_out
                    logprobs += batch_logprobs
        finally:
            self.model.train(was_training)
        seconds = time.perf_counter() - t0
        generated = sum(len(r) for r in out)
        self._logprobs = logprobs
        self._stats = {"generated_tokens": generated, "time_s": seconds, "tokens_per_s": generated / max(seconds, 1e-9)}
        return out

    def _next_tokens(self, ids, positions, cu, max_seqlen, view, last, params,
                     generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward; the logits (in the compute dtype, as the reference) of rows `last` ->
        ([B] ids, [B] fp32 log-probs)."""
        def head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return F.linear(hidden[last], weight)  # (B, V)

        logits = self.model(ids, positions, cu, max_seqlen, cache=view, head=head)
        tokens = sample_next_token(logits, params, generator)
        return tokens, token_logprobs_eager(logits, tokens)

    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> tuple[list[list[int]], list[torch.Tensor]]:
        """Responses of one batch and their log-probs ([len] fp32 on the host each)."""
        device = self.model.embed.weight.device
        lens = torch.tensor([len(p) for p in prompts], device=device)
        limits = new_token_limits(lens, params)
        cache = ContiguousKVCache(self.model, len(prompts), int((lens + limits).max()), self.kv_dtype)
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.int64, device=device)

        ids = torch.tensor([t for p in prompts for t in p], device=device)
        positions = torch.cat([torch.arange(len(p), device=device) for p in prompts])
        cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(torch.int32)
        rows = torch.arange(len(prompts), device=device)
        tokens, lp = self._next_tokens(ids, positions, cu, int(lens.max()), cache.view(rows, positions, cu),
                                       cu[1:].long() - 1, params, generator)

        responses: list[list[int]] = [[] for _ in prompts]
        logprobs = torch.zeros(len(prompts), int(limits.max()), dtype=torch.float32, device=device)
        num_new = torch.zeros_like(lens)
        live = rows
        while True:
            logprobs[live, num_new[live]] = lp
            num_new[live] += 1
            for i, tok in zip(live.tolist(), tokens.tolist()):
                responses[i].append(tok)
            running = ~finished(tokens, num_new[live], limits[live], stop_ids)
            sampled = len(live)
            if not bool(running.any()):
                self.progress.add(done=sampled, tokens=sampled)
                host = logprobs.cpu()
                return responses, [host[i, : len(r)].clone() for i, r in enumerate(responses)]
            live, tokens = live[running], tokens[running]
            self.progress.add(done=sampled - len(live), tokens=sampled)
            step_pos = lens[live] + num_new[live] - 1
            step_cu = torch.arange(len(live) + 1, device=device, dtype=torch.int32)
            every = torch.arange(len(live), device=device)
            tokens, lp = self._next_tokens(tokens, step_pos, step_cu, 1, cache.view(live, step_pos, step_cu),
                                           every, params, generator)
