"""The paged rollout engine: continuous batching over a paged KV pool, prompts shared by their k
samples, CUDA-graph decode. Implements `RolloutEngine`; the trainer's default on CUDA.

`generate` loops: whenever waiting work fits, prefill one chunk of it (packed whole prompts; the
k samples of a prompt take k independent first tokens from its one prefill and share its full
blocks); else one round of up to `decode_steps_per_round` decode steps of every running sequence.
The host plans a round (blocks for every position it may write, preemption, the round's uniforms),
the device runs its steps back to back, sampling, recording and stop checks included, and the
host syncs once per round to read its results (each row's token count and stop flag). A row that
stops inside a round runs the round's remaining steps without effect (counted as
`wasted_row_steps`); finished sequences free their blocks when the round is read and waiting ones
take them; when the pool runs out the newest sequence is preempted and later recomputed
(`scheduler`). The generated tokens and their log-probs (`base`: the unmodified distribution,
computed inside the decode step) stay on the device until the call ends.

Rounds, then overlapped rounds: the stop check runs on the device, so the host's scheduler runs
once per round of D steps instead of once per step, at a cost of at most D - 1 row steps per
stopped row (responses are hundreds to thousands of tokens). With `overlap_rounds` (the default)
the host also launches round r + 1 before it reads round r, so the device never waits for the
host's read, scheduling and launches between rounds: a row that did not stop in round r took
exactly its steps' tokens, so round r + 1 is planned from those counts; a row that reached its
limit in round r is released before the plan (it stopped whatever it sampled), and a row that
sampled a stop token runs round r + 1 without effect (its done flag stays set on the device) and
is released when round r is read. A prefill, and a plan that would need a preemption, read the
launched round first; so does the end of the call. Reading one round late changes no token.

Memory (Qwen2.5-0.5B in bf16: 494 M params): the weight copy costs params x 2 bytes (0.99 GB),
refreshed in place by `sync_weights` after each optimiser step; no fp32 copy is kept. The KV pool
is `kv_cache_bytes` (12 KiB per token for 0.5B), the logits buffer max_num_seqs x V x 2 bytes
(311 MB at 1024 x 151 936), the graphs' shared pool about one decode step's activations at
max_num_seqs (a few hundred MB at 0.5B), a round's uniforms, tokens and log-probs 16 bytes x
decode_steps_per_round x max_num_seqs (262 KB at 16 x 1024), and per call the generated tokens
and their log-probs, 8 bytes x samples x (max new tokens + 1). With `keep_cache` (default) pool,
buffer and graphs stay between `generate` calls (the RL phase runs beside them); without it they
are freed after each call and rebuilt at the next (every bucket recaptured per call; the memory
goes back to the RL phase). With a `sizer` the pool is resized between steps from what each step
needed (`fit_memory`, `pool_sizing`).

Sampling follows reference 4.2 as a distribution (`oreal_fast.kernels.sampling`: inverse CDF on one
uniform per row and step from the caller's generator), so a run resumed with the generator's state
samples what the straight run did. The stream: each prefill chunk draws `torch.rand(k_total)` for
its first tokens; each decode round draws `torch.rand(steps, num_rows)` in one call, element
[j, r] feeding row r at step j; with overlapped rounds, num_rows still counts the rows that
stopped on a stop token in the round before. Which uniform feeds which token therefore depends on
`decode_steps_per_round` and `overlap_rounds`: a sampled run is reproducible for given settings,
not across them, and where the pool preempts, for a given pool size (a resized pool admits rows
in other rounds). Greedy runs
pick the same tokens for every D (on the GPU, up to bf16 near-ties: rows leave and join the batch
at round ends, so a step may run at another batch bucket).

Out of GPU memory: the engine recovers where it can. A prefill chunk whose forward runs out is run
again in two halves (the packed prompts do not attend to each other, so each half computes what the
whole did, up to the GEMMs' kernel choice for another row count), down to one prompt, and later chunks take at most
half its tokens (`max_prefill_tokens` for the rest of the engine's life). A pool (or its graphs)
that cannot be allocated, at the start of a call or at a resize, is retried at half the size, down
to the smallest pool the engine takes; the smaller pool preempts more (greedy responses are the
same; sampled ones draw their uniforms in other rounds, as at any pool size). Each recovery logs one
warning and is counted in the next call's `stats` (`prefill_oom_splits`, `pool_oom_shrinks`). Anything else (a
decode round, which runs in the graphs' memory, or the last split or shrink failing) raises
`torch.OutOfMemoryError` to the caller (the trainer turns it into one line, `oreal_fast.oom`).

Not here: block bookkeeping (`block_manager`), admission and preemption (`scheduler`), tensors
and graphs (`model_runner`).
Invariant: responses come back in prompt order, each ending with its stop token when it stopped
on one; after `generate` every KV block is free.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from oreal_fast.model.decoder import Decoder
from oreal_fast.progress import Progress
from oreal_fast.rollout.base import SamplingParams, check_prompts, new_token_limits
from oreal_fast.rollout.engine.block_manager import BlockManager, shared_prefix_groups
from oreal_fast.rollout.engine.model_runner import ModelRunner, RoundState, sample_tokens
from oreal_fast.rollout.engine.pool_sizing import PoolSizer
from oreal_fast.rollout.engine.scheduler import PrefillItem, Scheduler
from oreal_fast.rollout.engine.sequence import Sequence, group_prompts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Sizes of the engine (config keys of the same names in brackets, see docs/rollout.md)."""

    max_model_len: int  # longest prompt + response, in tokens [gen_max_length]
    kv_cache_bytes: int  # bytes of the KV pool [kv_cache_gib, kv_cache_memory_fraction]
    block_size: int = 16  # token slots per KV block [kv_block_size]
    max_num_seqs: int = 1024  # sequences decoded together [max_num_seqs]
    max_prefill_batch: int = 16  # whole prompts per prefill chunk [max_prefill_batch]
    max_prefill_tokens: int = 16384  # tokens per prefill chunk; a longer prompt goes alone [max_prefill_tokens]
    cuda_graph: bool = True  # capture decode steps per batch bucket (CUDA only) [cuda_graph]
    keep_cache: bool = True  # keep pool, logits buffer and graphs between calls [rollout_keep_cache]
    watermark: float = 0.01  # share of the pool admission leaves free, as vLLM's block-manager watermark
    decode_steps_per_round: int = 16  # decode steps per host round trip [decode_steps_per_round]
    # plan and launch each decode round before reading the last one's results, so the GPU does not
    # wait for the host between rounds; a row that samples a stop token then runs one more round
    # without effect (module docstring) [overlap_decode_rounds]
    overlap_rounds: bool = True
    # forwards of at most this many tokens run the few-token GEMV layers (CUDA): they win at one token
    # (decode step 1.01 vs 1.13 GPU ms on an H100) and lose from four on (benchmarks/RESULTS.md)
    gemv_max_tokens: int = 1
    # forwards of more tokens than that and at most this many run the skinny-GEMM layers (CUDA):
    # tensor-core GEMMs with SwiGLU and the split-K sums fused, 7 kernels a layer besides attention
    # where cuBLAS's layer runs 8 to 10 (`InferenceModel`). On an H100 the decode step took 1.06 ms
    # against 1.12-1.14 at 4 rows @128, 1.09 against 1.19-1.20 at 16 @128, 1.45 against 1.54-1.57 at
    # 16 @2048; its gate|up GEMM loses to cuBLAS's from 32 rows on (benchmarks/RESULTS.md); 0: never
    skinny_max_tokens: int = 16
    # the GEMV layers' kernels, and the decode attention's between them, launch with programmatic
    # dependent launch: each loads its weights while the kernel before it finishes. None: where the
    # device has it (Hopper and later; on an H100 the batch-1 step took 0.793 GPU ms with it, 0.862
    # without, same tokens: benchmarks/RESULTS.md); True: required; False: off
    gemv_pdl: bool | None = None
    # decode steps of at least this many rows (batch buckets) read the prompt blocks that a prompt's
    # samples share once per group of rows (`kernels.paged_attention.SharedPrefix`), not once per row:
    # one more kernel a layer, for fewer bytes where many rows share a prompt. Not yet timed in the
    # engine on a GPU; 0: never
    shared_prefix_min_rows: int = 0

    def __post_init__(self) -> None:
        if self.decode_steps_per_round < 1:
            raise ValueError(f"EngineConfig.decode_steps_per_round = {self.decode_steps_per_round}: must be >= 1")
        if self.gemv_max_tokens < 0:
            raise ValueError(f"EngineConfig.gemv_max_tokens = {self.gemv_max_tokens}: must be >= 0")
        if self.skinny_max_tokens < 0:
            raise ValueError(f"EngineConfig.skinny_max_tokens = {self.skinny_max_tokens}: must be >= 0")
        if self.shared_prefix_min_rows < 0:
            raise ValueError(f"EngineConfig.shared_prefix_min_rows = {self.shared_prefix_min_rows}: must be >= 0")


@dataclass
class LaunchedRound:
    """A decode round on the device whose results the host has not read: its steps, the rows'
    state on its way to the host, the sequences of its rows in launch order, and where each of
    them is now among the running rows (-1 once it left them)."""

    steps: int
    state: RoundState
    seqs: list[Sequence]
    rows: np.ndarray

    def follow(self, keep: np.ndarray) -> None:
        """The running rows were compacted to `keep` (old row indices, in their new order)."""
        new_index = np.full(self.rows.size, -1, dtype=np.int64)  # rows only leave: indices stay below this
        new_index[keep] = np.arange(keep.size)
        self.rows = np.where(self.rows >= 0, new_index[self.rows], -1)


# Where a call's time goes: prefill, and decode rounds by their rows (label, largest row count)
BATCH_BUCKETS = (("1", 1), ("2_16", 16), ("17_128", 128), ("129_512", 512), ("513_up", None))


@dataclass
class RoundCounts:
    """Decode work of one `generate` call: a row step is one row in one step; it is live when the
    row had not stopped (it sampled a token that is kept), wasted when it had stopped earlier in
    its round (or, with overlapped rounds, in the round before).

    `seconds`: the call's wall time from one host sync to the next, charged to what the later sync
    waited for: a prefill chunk ("prefill") or a decode round (its rows' bucket of BATCH_BUCKETS).
    The host runs ahead of the device, so each interval is about the device time of that work."""

    rounds: int = 0
    steps: int = 0
    row_steps: int = 0
    live_row_steps: int = 0
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(["prefill"] + [label for label, _ in BATCH_BUCKETS], 0.0))
    last_sync: float = field(default_factory=time.perf_counter)

    def add(self, steps: int, num_rows: int, taken: int) -> None:
        self.rounds += 1
        self.steps += steps
        self.row_steps += steps * num_rows
        self.live_row_steps += taken
        self.synced(next(label for label, most in BATCH_BUCKETS if most is None or num_rows <= most))

    def synced(self, work: str) -> None:
        """A host sync that waited for `work` ("prefill" or a batch bucket's label) just returned."""
        now = time.perf_counter()
        self.seconds[work] += now - self.last_sync
        self.last_sync = now


class PagedEngine:
    """Implements `RolloutEngine` (see the module docstring).

    Args:
        actor: the trained model; the engine copies its config and weights.
        config: the engine's sizes.
        dtype: compute dtype of the copy and the pool (default the actor's parameter dtype).
        progress: gets the responses finished and tokens sampled at each prefill chunk's and decode
            round's one host sync, from the values that sync reads (no sync of its own).
        sizer: resizes the pool between steps from each step's measured need (`fit_memory`,
            `pool_sizing`); None keeps `config.kv_cache_bytes`.
    """

    def __init__(self, actor: Decoder, config: EngineConfig, *, dtype: torch.dtype | None = None,
                 sizer: PoolSizer | None = None, progress: Progress | None = None) -> None:
        self.config, self.sizer = config, sizer
        dtype = dtype or actor.embed.weight.dtype
        c = actor.config
        self.block_bytes = 2 * c.num_layers * config.block_size * c.num_kv_heads * c.head_dim * dtype.itemsize
        self.max_blocks_per_seq = -(-config.max_model_len // config.block_size)
        capacity = self._pool_blocks(config.kv_cache_bytes)
        self.runner = ModelRunner(actor, dtype=dtype, num_blocks=capacity + 1, block_size=config.block_size,
                                  max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
                                  cuda_graph=config.cuda_graph, steps_per_round=config.decode_steps_per_round,
                                  gemv_max_tokens=config.gemv_max_tokens,
                                  skinny_max_tokens=config.skinny_max_tokens, gemv_pdl=config.gemv_pdl,
                                  shared_prefix_min_rows=config.shared_prefix_min_rows)
        self._track_blocks(capacity)
        self.device = self.runner.device
        self.oom_counts = {"prefill_oom_splits": 0, "pool_oom_shrinks": 0}  # since the last call's stats
        self._allocate()
        self._stats: dict[str, float] = {}
        self.progress = progress or Progress()
        self._logprobs: list[torch.Tensor] = []

    def _beside_watermark(self, blocks: int) -> int:
        """The fewest blocks a pool needs so that `blocks` of them stay usable beside its watermark."""
        total = blocks
        while total - int(self.config.watermark * total) < blocks:
            total += 1
        return total

    def _pool_blocks(self, kv_cache_bytes: int) -> int:
        """Blocks a pool of `kv_cache_bytes` holds, the null block aside, capped at what the engine
        could ever use at once (max_num_seqs sequences of max_model_len, beside the watermark)."""
        config, block_bytes = self.config, self.block_bytes
        capacity = min(kv_cache_bytes // block_bytes,
                       self._beside_watermark(config.max_num_seqs * self.max_blocks_per_seq))
        if capacity - int(config.watermark * capacity) < self.max_blocks_per_seq:
            raise ValueError(
                f"KV pool of {kv_cache_bytes / 2**30:.3g} GiB holds {capacity * config.block_size} tokens "
                f"({block_bytes} bytes per block of {config.block_size}): less than one sequence of "
                f"max_model_len = {config.max_model_len} tokens; raise kv_cache_gib or kv_cache_memory_fraction")
        return capacity

    def _track_blocks(self, capacity: int) -> None:
        config = self.config
        self.blocks = BlockManager(capacity + 1, config.block_size)  # + the null block
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_prefill_batch,
                                   config.max_prefill_tokens, int(config.watermark * capacity))

    @property
    def pool_bytes(self) -> int:
        """The pool's size as `EngineConfig.kv_cache_bytes` counts it (the null block aside)."""
        return self.blocks.capacity * self.block_bytes

    def pool_bytes_range(self) -> tuple[int, int]:
        """(smallest, largest) pool the engine takes: one max_model_len sequence beside the
        watermark, and max_num_seqs of them."""
        smallest = self._beside_watermark(self.max_blocks_per_seq)
        largest = self._beside_watermark(self.config.max_num_seqs * self.max_blocks_per_seq)
        return smallest * self.block_bytes, largest * self.block_bytes

    def fit_memory(self, peak_gib: Mapping[str, float]) -> None:
        """Resize the pool from a step's peaks, when a `sizer` is set (see `RolloutEngine.fit_memory`).

        The step's need is its peak besides the pool over the phases the pool was allocated in:
        ``gen``, and ``rl`` too with ``keep_cache``.
        """
        if self.sizer is None:
            return
        phases = ("gen", "rl") if self.config.keep_cache else ("gen",)
        need = int(max(peak_gib[p] for p in phases) * 2**30) - self.pool_bytes
        smallest, largest = self.pool_bytes_range()
        target = self.sizer.next_bytes(self.pool_bytes, need, min_bytes=smallest, max_bytes=largest)
        if target != self.pool_bytes:
            self.resize_pool(target)

    def memory_state(self) -> dict[str, int]:
        """The pool's size and the largest step need seen (see `RolloutEngine.memory_state`)."""
        return {} if self.sizer is None else {"pool_bytes": self.pool_bytes, "need_bytes": self.sizer.need_bytes}

    def load_memory_state(self, state: Mapping[str, int]) -> None:
        """The pool of a resumed run: the size the straight run had reached (see `RolloutEngine`)."""
        if self.sizer is None or not state:
            return
        self.sizer.need_bytes = state["need_bytes"]
        if state["pool_bytes"] != self.pool_bytes:
            self.resize_pool(state["pool_bytes"])

    def resize_pool(self, kv_cache_bytes: int) -> None:
        """A pool of `kv_cache_bytes` from now on, between `generate` calls (every block is free
        then): the old pool and the graphs are freed first, then the new pool is allocated and the
        graphs recaptured (if the old one was allocated; else at the next call)."""
        if self.blocks.num_used:
            raise RuntimeError(f"resize_pool: {self.blocks.num_used} KV blocks are in use; resize between calls")
        allocated = self.runner.allocated
        self._set_pool(kv_cache_bytes)
        if allocated:
            self._allocate()

    def _set_pool(self, kv_cache_bytes: int) -> None:
        """Free the pool and the graphs, and track a pool of `kv_cache_bytes` (allocated by `_allocate`)."""
        capacity = self._pool_blocks(kv_cache_bytes)
        self.runner.free()
        self.runner.set_pool_blocks(capacity + 1)
        self.config = dataclasses.replace(self.config, kv_cache_bytes=kv_cache_bytes)
        self._track_blocks(capacity)

    def _allocate(self) -> None:
        """Allocate the pool (and capture the graphs); out of memory, retry at half the pool, down to the
        smallest one (module docstring). Every block is free when this runs."""
        while True:
            try:
                self.runner.allocate()
                return
            except torch.OutOfMemoryError:
                smallest, _ = self.pool_bytes_range()
                if self.pool_bytes <= smallest:
                    self.runner.free()
                    raise
                target = max(smallest, self.pool_bytes // 2)
                log.warning("out of GPU memory allocating the KV pool of %.3g GiB (and its CUDA graphs); "
                            "retrying with %.3g GiB", self.pool_bytes / 2**30, target / 2**30)
                self.oom_counts["pool_oom_shrinks"] += 1
                self._set_pool(target)

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Refresh the weight copy in place (see `RolloutEngine.sync_weights`)."""
        self.runner.sync_weights(weights)

    def stats(self) -> dict[str, float]:
        """The last `generate` call: tokens, time, decode steps and rounds, live batch, wasted row steps,
        the pool's size and use, prefix sharing, preemption."""
        return dict(self._stats)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator,
        *, max_new_per_prompt: list[int] | None = None,
    ) -> list[list[int]]:
        """Sample one response per prompt (see `RolloutEngine.generate`).

        `max_new_per_prompt`: an extra new-token cap per prompt (benchmarks replaying drawn lengths);
        the stop rule then uses min(this, max_new_tokens, max_length - prompt length).
        """
        check_prompts(prompts, params)
        if params.max_length > self.config.max_model_len:
            raise ValueError(f"max_length {params.max_length} exceeds the engine's max_model_len "
                             f"{self.config.max_model_len}")
        limits = new_token_limits(torch.tensor([len(p) for p in prompts]), params).tolist()
        if max_new_per_prompt is not None:
            if len(max_new_per_prompt) != len(prompts) or min(max_new_per_prompt, default=1) < 1:
                raise ValueError(f"max_new_per_prompt: need one int >= 1 per prompt ({len(prompts)}), "
                                 f"got {len(max_new_per_prompt)} values, smallest {min(max_new_per_prompt, default=None)}")
            limits = [min(a, b) for a, b in zip(limits, max_new_per_prompt)]
        t0 = time.perf_counter()
        if not self.runner.allocated:
            self._allocate()
        groups = group_prompts(prompts, limits)
        seqs = sorted((s for g in groups for s in g.members), key=lambda s: s.out_row)
        rounds = RoundCounts()
        with torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            self.runner.begin(len(prompts), max(limits), params)
            self.scheduler.start(groups)
            self._run(params, generator, rounds)
            out = self.runner.responses([s.num_new for s in seqs])
            self._logprobs = self.runner.response_logprobs([s.num_new for s in seqs])
        if not self.config.keep_cache:
            self.runner.free()
        self._record_stats(out, rounds, time.perf_counter() - t0)
        return out

    def response_logprobs(self) -> list[torch.Tensor]:
        """Log-probs of the last `generate` call's tokens (see `RolloutEngine.response_logprobs`)."""
        return self._logprobs

    def _sample(self, logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        uniform = torch.rand(logits.shape[0], generator=generator, device=self.device) if params.do_sample else None
        return sample_tokens(logits, uniform, params, self.runner.sample_impl)

    def _prefill(self, chunk: list[PrefillItem], params: SamplingParams, generator: torch.Generator,
                 counts: RoundCounts) -> None:
        runner = self.runner
        specs = [(it.seqs[0].prompt, it.seqs[0].out_row, 0 if it.fresh else it.seqs[0].num_new - 1, it.table)
                 for it in chunk]
        fresh = [i for i, it in enumerate(chunk) if it.fresh]
        logits = self._prefill_logits(specs, fresh, sum(it.num_tokens for it in chunk))
        first = first_lp = None
        if fresh:  # k independent draws from each prompt's one distribution
            samples = torch.tensor([len(chunk[i].seqs) for i in fresh], device=self.device)
            total = sum(len(chunk[i].seqs) for i in fresh)
            first, first_lp = self._sample(logits.repeat_interleave(samples, dim=0, output_size=total), params,
                                           generator)
        start_row = runner.num_rows
        runner.copy_blocks(self.scheduler.admit(chunk))
        pieces, segments, offset, row = [], [], 0, start_row
        for it in chunk:
            m = len(it.seqs)
            if it.fresh:
                pieces.append(first[offset : offset + m])
                segments.append((row, offset, m))
                offset += m
            else:
                pieces.append(runner.pending_tokens([it.seqs[0].out_row], [it.seqs[0].num_new]))
            row += m
        new = self.scheduler.running[start_row:]
        runner.add_rows(torch.cat(pieces), [s.length - 1 for s in new], [s.num_new for s in new],
                        [s.limit for s in new], [s.out_row for s in new], [s.block_table for s in new])
        done = torch.zeros(runner.num_rows, dtype=torch.bool, device=self.device)
        for row, offset, m in segments:
            done[row : row + m] = runner.record(row, first[offset : offset + m], first_lp[offset : offset + m])
        self._finish(done, first_tokens=0 if first is None else len(first))
        counts.synced("prefill")

    def _prefill_logits(self, specs: list, fresh: list[int], num_tokens: int) -> torch.Tensor:
        """`runner.prefill(specs, fresh)`; out of memory, the same in two halves (module docstring)."""
        try:
            return self.runner.prefill(specs, fresh)
        except torch.OutOfMemoryError:
            if len(specs) == 1:
                raise
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the failed forward's blocks, cached by the allocator
        cap = max(1, min(self.config.max_prefill_tokens, num_tokens // 2))
        self.config = dataclasses.replace(self.config, max_prefill_tokens=cap)
        self.scheduler.max_prefill_tokens = cap
        self.oom_counts["prefill_oom_splits"] += 1
        log.warning("out of GPU memory in a prefill of %d prompts (%d tokens): running it in two halves; "
                    "later prefills take at most %d tokens", len(specs), num_tokens, cap)
        half = len(specs) // 2
        lengths = [len(prompt) + num_gen for prompt, _, num_gen, _ in specs]
        first = self._prefill_logits(specs[:half], [i for i in fresh if i < half], sum(lengths[:half]))
        second = self._prefill_logits(specs[half:], [i - half for i in fresh if i >= half], sum(lengths[half:]))
        return torch.cat((first, second))

    def _run(self, params: SamplingParams, generator: torch.Generator, counts: RoundCounts) -> None:
        """Prefill chunks and decode rounds until every sequence finished. With `overlap_rounds` the
        next round is launched before the last one is read (`flight`); a prefill, or a round that
        cannot be planned without knowing which rows stopped, reads it first."""
        scheduler, flight = self.scheduler, None
        while not scheduler.done:
            if flight is not None:
                self._retire_at_limit(flight)
            chunk = scheduler.schedule_prefill()
            if chunk:
                self._read_round(flight, counts)
                flight = None
                self._prefill(chunk, params, generator, counts)
                continue
            launched = self._launch_round(params, generator, flight) if scheduler.running else None
            self._read_round(flight, counts, newer=launched)
            flight = launched
            if not self.config.overlap_rounds:
                self._read_round(flight, counts)
                flight = None
        self._read_round(flight, counts)

    def _retire_at_limit(self, flight: LaunchedRound) -> None:
        """Release the rows that reach their limit in the unread round (`Scheduler.retire_at_limit`)."""
        keep = self.scheduler.retire_at_limit(flight.steps)
        if keep is not None:
            self.runner.keep_rows(keep)
            flight.follow(keep)

    def _launch_round(self, params: SamplingParams, generator: torch.Generator,
                      flight: LaunchedRound | None) -> LaunchedRound | None:
        """Plan and launch one round of decode steps of every running sequence, after `flight`
        (unread) if given; None when it cannot be planned before `flight` is read."""
        runner, scheduler = self.runner, self.scheduler
        plan = scheduler.prepare_round(self.config.decode_steps_per_round, ahead=0 if flight is None else flight.steps)
        if plan is None:
            return None
        num_rows, steps, entries = plan
        if num_rows < runner.num_rows:  # the last rows were preempted
            runner.keep_rows(np.arange(num_rows))
        runner.set_blocks(entries)
        if self.config.shared_prefix_min_rows:
            runner.set_shared_prefix(*shared_prefix_groups([s.block_table for s in scheduler.running],
                                                           self.config.block_size, runner.max_group_rows))
        uniform = torch.rand(steps, num_rows, generator=generator, device=self.device) if params.do_sample else None
        runner.start_round(uniform)
        width = scheduler.max_table_len()
        for _ in range(steps):
            runner.decode_step(width)
        return LaunchedRound(steps, runner.end_round(steps), list(scheduler.running), np.arange(num_rows))

    def _read_round(self, flight: LaunchedRound | None, counts: RoundCounts,
                    newer: LaunchedRound | None = None) -> None:
        """Read a launched round's results (its one host sync) and release the rows that stopped in
        it; `newer`, a round launched after it, follows the rows' compaction."""
        if flight is None:
            return
        num_new, done, taken = flight.state.read()
        running = flight.rows >= 0
        for i in np.flatnonzero(~running):  # retired at their limit: the count they really reached
            flight.seqs[i].num_new = int(num_new[i])
        n = len(self.scheduler.running)
        rows = flight.rows[running]
        if rows.size != n:
            raise RuntimeError(f"decode round read with {n} running rows but {rows.size} of its rows still running")
        now_new, now_done = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
        now_new[rows], now_done[rows] = num_new[running], done[running]
        counts.add(flight.steps, len(flight.seqs), int(taken.sum()))
        # a row live when the round began took at least one token in it: the rows that stopped in it
        self.progress.add(done=int((done & (taken > 0)).sum()), tokens=int(taken.sum()))
        keep = self.scheduler.end_round(now_new, now_done)
        if keep is not None:
            self.runner.keep_rows(keep)
            if newer is not None:
                newer.follow(keep)

    def _finish(self, done: torch.Tensor, first_tokens: int) -> None:
        done = done.cpu().numpy()  # the prefill's one host sync
        self.progress.add(done=int(done.sum()), tokens=first_tokens)
        keep = self.scheduler.finish(done)
        if keep is not None:
            self.runner.keep_rows(keep)

    def _record_stats(self, out: list[list[int]], rounds: RoundCounts, seconds: float) -> None:
        s = self.scheduler.stats
        generated = sum(len(r) for r in out)
        self._stats = {
            "generated_tokens": generated,
            "tokens_per_s": generated / max(seconds, 1e-9),
            "time_s": seconds,
            "decode_steps": rounds.steps,
            "decode_rounds": rounds.rounds,
            "mean_live_batch": rounds.live_row_steps / max(rounds.steps, 1),
            "wasted_row_steps": rounds.row_steps - rounds.live_row_steps,
            "kv_pool_gib": self.pool_bytes / 2**30,
            "peak_kv_use": s.peak_blocks_used / self.blocks.capacity,
            "prefix_hit_rate": 1.0 - s.prompt_tokens_prefilled / max(s.prompt_tokens, 1),
            "kv_blocks_saved": s.kv_blocks_saved,
            "preemptions": s.preemptions,
            "recomputed_tokens": s.recomputed_tokens,
            # after the call: every sequence finished, so 0 unless blocks leak (a long run's soak watches it)
            "kv_blocks_in_use": self.blocks.num_used,
            # wall seconds by what the host waited for (RoundCounts.seconds)
            "prefill_s": rounds.seconds["prefill"],
            **{f"decode_s_batch_{label}": rounds.seconds[label] for label, _ in BATCH_BUCKETS},
            **self.oom_counts,
        }
        self.oom_counts = dict.fromkeys(self.oom_counts, 0)
