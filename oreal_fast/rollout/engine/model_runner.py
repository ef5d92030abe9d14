"""The tensors of the rollout engine: the bf16 weight copy, the KV pool, the running rows'
device state, and the decode step (eager or CUDA graphs per batch bucket), run in rounds.

Weight copy: an `InferenceModel` (q|k|v and gate|up packed, fused elementwise kernels on CUDA),
refreshed in place by `sync_weights` from the Decoder's `(name, tensor)` pairs.

KV pool: one tensor [num_layers, 2 (k, v), num_blocks, block_size, Hkv, D] in the compute dtype;
layer l's caches are the contiguous views `kv[l, 0]` and `kv[l, 1]`, so one indexing op copies a
block in every layer (copy-on-write of a forked prompt's last block). The caches of one forward
(`PrefillCache`, `DecodeCache`) take each layer's un-roped q|k|v GEMM output: one kernel
(`rope_write_kv`) ropes q and k and writes k, v at the tokens' slots, then they attend. The
few-token GEMV layers rope and write in their q|k|v kernel instead, into the pools and slots
`kv_pool` gives, and hand the caches the roped q (`attend_roped`).

Row state (device, `max_num_seqs` rows, the first `num_rows` live, in the scheduler's row order):
`input_ids` (the pending token), `positions` (its position), `block_tables`
[max_num_seqs, max_blocks_per_seq] int32, `num_new`, `limits`, `out_rows` (row of the generated-token
buffer), `done` (stopped: set by the stop check, cleared only for rows `add_rows` appends). A
decode step derives from them its `slots` (block_tables[pos // block_size] * block_size + pos %
block_size) and `context_lens` (pos + 1), written in place into buffers of their own. With
`shared_prefix_min_rows`, `prefix_lens` and `group_rows` (`SharedPrefix`) name the groups of rows that share
a prompt's blocks, set before each round (`set_shared_prefix`) and cleared when rows move. Rows past
`num_rows` are all zeros and `done`; a done row writes its k/v into the null block (id 0,
`NULL_BLOCK`), which nothing reads, so a CUDA graph padded up to its bucket and a row that stopped
in an earlier step write nothing anyone reads.

A round (`start_round`, `decode_step` x steps, `end_round`) runs several decode steps with no host
sync: each step is the forward, then its tail, all on the device: sample (greedy argmax, or the
sampler on row `step` of the round's uniforms [steps, num_rows], which the step's `decode_slots`
copied into `step_uniform` before the layers ran), store the tokens in the round
buffer `round_tokens` [steps_per_round, max_num_seqs] and their log-probs in `round_logprobs`
(fp32, the same shape), count the token of every row not done, mark done the rows that now meet
the stop rule, and advance the others (pending token, position), so a stopped row's later tokens
are never recorded and its num_new stays. `end_round`
moves the recorded tokens and log-probs into the call's output buffers and starts the copy of
num_new, done and each row's tokens taken to the host (pinned memory on CUDA, with an event);
`RoundState.read` waits for it: the round's one host sync. Nothing between a round's launch and
that read waits for the device (host-to-device copies of block tables and row indices go through
pinned memory without a sync), so the host can plan and launch the next round first.

Log-probs: each sampled token's log_softmax(logits.float())[token] at temperature 1, before any
filter (the distribution the trainer's log-probs are taken under), from the sampler's own sweep
(`sample_with_logprobs`), or for greedy rows from `token_logprobs` (one more read of the logits).
The prefill's first tokens get theirs the same way; a recomputed sequence keeps the log-probs
its tokens were sampled with.

CUDA graphs: one forward graph per batch bucket (1, 2, 4, 8, 16, 32, then steps of 32 to 256 and of
64 beyond, up to max_num_seqs), captured at `allocate`, largest first, into one shared memory
pool, each after one eager step; each runs embedding -> layers -> final norm -> LM head into the
static `logits` buffer [max_num_seqs, V] (compute dtype). The tail has one graph per bucket and
sampling setting (the sampler's settings and the stop ids are fixed at capture), captured in the
same pool the first time that pair runs, right after that step's tail ran eagerly.

Kernels of one decode step on CUDA, per layer (9, or 10 when attention splits the context; cuBLAS
may add one to a GEMM, e.g. a split-K reduction):
  1. add_rms_norm (the previous MLP's output into the residual stream, then attn_norm)
  2. q|k|v GEMM with its bias (addmm)
  3. rope_write_kv (rope q and k, write k and v into the pool)
  4. paged decode attention (a second, combining kernel when the context is split; with
     `shared_prefix_min_rows` at or below the bucket, a kernel before it reads each group's shared
     prompt once)
  5. o GEMM
  6. add_rms_norm (attention's output into the residual stream, then mlp_norm)
  7. gate|up GEMM
  8. silu_mul on the two halves of the gate|up output
  9. down GEMM
With `gemv_max_tokens` at or above a bucket, that bucket's layers run 1-3, 5-9 as four kernels
(`InferenceModel`'s few-token path: 5 or 6 per layer); with `skinny_max_tokens` at or above it (and
`gemv_max_tokens` below), 1-3 and 5-9 as seven: q|k|v, o, gate|up with SwiGLU and down as
tensor-core skinny GEMMs, o and down leaving fp32 partials that the next norm adds (8 or 9).
Once per step: before the layers `decode_slots` (the slots, context lengths and the step's
uniforms: one kernel) and the embedding; after them the final add_rms_norm and the LM head;
then sampling (with the tokens' log-probs; greedy rows take one more pass over the logits) and
`decode_tail` (recording, the count, the stop check, advancing the rows and `step`: one kernel).
Both row-state kernels are `oreal_fast.kernels.decode_tail`'s (their eager twins off CUDA).

Not here: which rows exist (`scheduler`), sampling and the loop (`engine`).
Invariant: the weights, the pool and the row-state tensors are allocated once and only written in
place, so captured graphs stay valid (a pool of another size comes only after `free`, which drops
the graphs with the old pool); rows >= num_rows are zero and done.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from oreal_fast.kernels.common import check_pdl, pdl_available
from oreal_fast.kernels.decode_tail import decode_slots, decode_tail
from oreal_fast.kernels.paged_attention import SharedPrefix, max_group_rows, paged_decode_attention
from oreal_fast.kernels.sampling import sample_with_logprobs, token_logprobs
from oreal_fast.kernels.trunk_inference import rope_write_kv
from oreal_fast.model.attention import make_backend, resolve_backend_name
from oreal_fast.model.decoder import Decoder, max_rope_positions
from oreal_fast.parallel import full_weights
from oreal_fast.rollout.base import SamplingParams, finished
from oreal_fast.rollout.engine.inference_model import InferenceModel


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes that get a CUDA graph: 1, 2, 4, ..., 32, +32 up to 256, +64 beyond; max_num_seqs last."""
    sizes = [b for b in (1, 2, 4, 8, 16, 32) if b < max_num_seqs]
    b = 32
    while b + (32 if b < 256 else 64) < max_num_seqs:
        b += 32 if b < 256 else 64
        sizes.append(b)
    return sizes + [max_num_seqs]


def sample_tokens(logits: torch.Tensor, uniform: torch.Tensor | None, params: SamplingParams,
                  impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] int64 from logits [B, V]: greedy argmax, or reference 4.2 by inverse CDF on
    `uniform` [B] fp32 (one draw per row from the caller's generator; None when greedy); and
    their log-probs [B] fp32 under log_softmax(logits.float()) (temperature 1, unfiltered)."""
    if not params.do_sample:
        tokens = logits.argmax(dim=-1)
        return tokens, token_logprobs(logits, tokens, impl=impl)
    return sample_with_logprobs(logits, uniform, temperature=params.temperature, top_k=params.top_k,
                                top_p=params.top_p, impl=impl)


class PrefillCache:
    """`PagedCache` of a prefill: rope q and k and write k, v at their pool slots (one kernel, or the
    caller's q|k|v kernel: `kv_pool`, `attend_roped`), then attend the new tokens causally among
    themselves (no sequence in a prefill has a cached prefix), on the roped k, v read back from the
    pool."""

    def __init__(self, kv: torch.Tensor, slots: torch.Tensor, backend, cu_seqlens: torch.Tensor, max_seqlen: int):
        self.kv, self.slots, self.backend, self.cu, self.max_seqlen = kv, slots, backend, cu_seqlens, max_seqlen
        self.impl = "triton" if kv.device.type == "cuda" else "eager"

    def kv_pool(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.kv[layer, 0], self.kv[layer, 1], self.slots

    def attend(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        kv = self.kv[layer]
        return self.attend_roped(layer, rope_write_kv(qkv, positions, rope, kv[0], kv[1], self.slots, impl=self.impl))

    def attend_roped(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kv = self.kv[layer]
        Hkv, D = kv.shape[-2:]
        k, v = (kv[i].view(-1, Hkv, D)[self.slots] for i in (0, 1))  # (T, Hkv, D) each
        return self.backend(q, k, v, self.cu, self.max_seqlen)


class DecodeCache:
    """`PagedCache` of a decode step: one token per row, roped and written at its slot (one kernel,
    or the caller's q|k|v kernel: `kv_pool`, `attend_roped`), attending over the row's whole
    context through its block table."""

    def __init__(self, kv: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, impl: str, pdl: bool = False, shared: SharedPrefix | None = None):
        self.kv, self.slots, self.block_tables, self.context_lens, self.impl = kv, slots, block_tables, context_lens, impl
        self.pdl = pdl  # the kernels launch with programmatic dependent launch (the GEMV layers' steps)
        self.shared = shared  # rows sharing their prompt's blocks, read once per group

    def kv_pool(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.kv[layer, 0], self.kv[layer, 1], self.slots

    def attend(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        kv = self.kv[layer]
        q = rope_write_kv(qkv, positions, rope, kv[0], kv[1], self.slots, pdl=self.pdl, impl=self.impl)
        return self.attend_roped(layer, q)

    def attend_roped(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kv = self.kv[layer]
        return paged_decode_attention(q, kv[0], kv[1], self.block_tables, self.context_lens, pdl=self.pdl,
                                      impl=self.impl, shared=self.shared)


@dataclass
class RoundState:
    """The rows' state after a round, on its way to the host: [3, rows] int64 (num_new, done, tokens
    taken in the round), valid once `copied` has run (None: already on the host)."""

    host: np.ndarray
    copied: torch.cuda.Event | None

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(num_new [rows] int64, done [rows] bool, taken [rows] int64), waiting for the copy."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.host[0], self.host[1].astype(bool), self.host[2]


class ModelRunner:
    """Owns every tensor of the engine (see the module docstring).

    Args:
        actor: the trained model; its config and weights are copied (`sync_weights`).
        dtype: the compute dtype of the copy and of the pool.
        num_blocks: blocks in the pool, the null block included.
        block_size: token slots per block.
        max_num_seqs: rows of the decode batch.
        max_model_len: longest sequence (prompt + response) a block table covers.
        cuda_graph: capture the decode step (CUDA only).
        steps_per_round: the most decode steps of one round.
        gemv_max_tokens: forwards of at most this many tokens (decode buckets, small prefills) run
            the weight copy's few-token GEMV layers on CUDA (`InferenceModel`); 0 never does.
        skinny_max_tokens: forwards of more tokens than that and at most this many run its
            skinny-GEMM layers on CUDA (`InferenceModel`); 0 never does.
        gemv_pdl: the GEMV layers' kernels launch with programmatic dependent launch; None: where
            the device has it (`kernels.common.pdl_available`).
        shared_prefix_min_rows: decode steps of at least this many rows (2 at least: a group's)
            read the blocks that groups of rows share once per group (`set_shared_prefix` gives
            the groups); 0 never do.
    """

    def __init__(self, actor: Decoder, *, dtype: torch.dtype, num_blocks: int, block_size: int,
                 max_num_seqs: int, max_model_len: int, cuda_graph: bool, steps_per_round: int,
                 gemv_max_tokens: int, skinny_max_tokens: int, gemv_pdl: bool | None,
                 shared_prefix_min_rows: int = 0) -> None:
        device = actor.embed.weight.device
        self.device, self.dtype, self.block_size = device, dtype, block_size
        self.num_blocks, self.max_num_seqs = num_blocks, max_num_seqs
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.use_graphs = cuda_graph and device.type == "cuda"
        # CUDA decodes at the graphs' shapes even eagerly (bucket rows, every block-table column), so
        # graph and eager steps run the same kernels and pick the same tokens; CPU decodes the live rows
        self.static_shapes = device.type == "cuda"
        self.attn_impl = "triton" if device.type == "cuda" else "eager"
        self.sample_impl = "triton" if device.type == "cuda" else "eager"
        # the row-state arithmetic around the forward (decode_slots, decode_tail)
        self.row_state_impl = "triton" if device.type == "cuda" else "eager"
        c = actor.config
        if max_model_len > max_rope_positions(c):
            raise ValueError(f"max_model_len {max_model_len} exceeds the {max_rope_positions(c)} positions "
                             f"of the model's rope table")
        gemv_pdl = pdl_available(device) if gemv_pdl is None else gemv_pdl
        check_pdl("gemv_pdl", gemv_pdl, device)
        # on CUDA the copy's elementwise ops are Triton kernels (forward only), elsewhere their eager twins
        self.model = InferenceModel(c, device=device, dtype=dtype, impl=self.attn_impl,
                                    gemv_max_tokens=gemv_max_tokens, skinny_max_tokens=skinny_max_tokens,
                                    gemv_pdl=gemv_pdl).eval()
        self.prefill_backend = make_backend(resolve_backend_name("auto", device, dtype))
        self.shared_prefix_min_rows = shared_prefix_min_rows
        self.max_group_rows = max_group_rows(c.num_heads, c.num_kv_heads)
        self.sync_weights(full_weights(actor))
        self._allocate_row_state(steps_per_round)
        self.kv: torch.Tensor | None = None
        self.generated: torch.Tensor | None = None
        self.generated_logprobs: torch.Tensor | None = None
        self.sampling: SamplingParams | None = None
        self.stop_ids = torch.zeros(0, dtype=torch.int64, device=device)
        self._stop_ids: dict[tuple[int, ...], torch.Tensor] = {}  # one tensor per stop set, as graphs read it
        self.buckets = batch_buckets(max_num_seqs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.tail_graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._graph_pool = None
        self.logits: torch.Tensor | None = None

    def _allocate_row_state(self, steps_per_round: int) -> None:
        """The rows' device state and a round's (module docstring), every row zero and done."""
        R, M, device = self.max_num_seqs, self.max_blocks_per_seq, self.device
        zeros = lambda *shape, dtype=torch.int64: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.input_ids, self.positions, self.num_new = zeros(R), zeros(R), zeros(R)
        self.limits, self.out_rows = zeros(R), zeros(R)
        self.block_tables = zeros(R, M, dtype=torch.int32)
        self.done = torch.ones(R, dtype=torch.bool, device=device)
        # a decode step's pool slots and context lengths, derived from the rows' positions and tables
        self.slots, self.context_lens = zeros(R), zeros(R, dtype=torch.int32)
        # the rows' groups sharing a prompt's blocks (`set_shared_prefix`): all zero, no group
        self.prefix_lens, self.group_rows = zeros(R, dtype=torch.int32), zeros(R, dtype=torch.int32)
        self._cu = torch.arange(R + 1, dtype=torch.int32, device=device)
        # a round's state: its step, uniforms (all, and the step's row), tokens, and each row's num_new when it began
        self.step, self.round_start = zeros(1), zeros(R)
        self.uniform = torch.zeros(steps_per_round, R, dtype=torch.float32, device=device)
        self.step_uniform = torch.zeros(R, dtype=torch.float32, device=device)
        self.round_tokens = zeros(steps_per_round, R)
        self.round_logprobs = torch.zeros(steps_per_round, R, dtype=torch.float32, device=device)
        self.num_rows = 0

    # ------------------------------------------------------------------ memory

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's weights (``(name, whole tensor)`` pairs, see `RolloutEngine.sync_weights`)
        into the persistent copy, in place, cast to the compute dtype and packed (q|k|v, gate|up)."""
        self.model.load_weights(weights)

    def allocate(self) -> None:
        """The KV pool and, with CUDA graphs, the logits buffer and the captured graphs."""
        c = self.model.config
        self.kv = torch.zeros(c.num_layers, 2, self.num_blocks, self.block_size, c.num_kv_heads, c.head_dim,
                              dtype=self.dtype, device=self.device)
        self.logits = torch.empty(self.max_num_seqs, c.vocab_size, dtype=self.dtype, device=self.device)
        self.model.rope_table()  # made now, outside any graph
        if self.use_graphs:
            self._capture()

    def free(self) -> None:
        """Drop the pool, the graphs and the logits buffer (the weight copy stays)."""
        self.graphs, self.tail_graphs, self._graph_pool = {}, {}, None
        self.kv, self.logits, self.generated, self.generated_logprobs = None, None, None, None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def allocated(self) -> bool:
        return self.kv is not None

    def set_pool_blocks(self, num_blocks: int) -> None:
        """The pool's block count (null block included) for the next `allocate`; the pool must be freed."""
        if self.allocated:
            raise RuntimeError("set_pool_blocks: free the pool first (captured graphs hold its address)")
        self.num_blocks = num_blocks

    def _capture(self) -> None:
        pool = None
        with torch.no_grad():
            for b in reversed(self.buckets):
                # an eager step first: kernels that compile or tune per shape do it outside the capture
                self._decode_forward(b, self.max_blocks_per_seq)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._decode_forward(b, self.max_blocks_per_seq)
                pool = graph.pool()
                self.graphs[b] = graph
        self._graph_pool = pool
        torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ a generate call

    def begin(self, num_outputs: int, max_new: int, params: SamplingParams) -> None:
        """Output buffers [num_outputs, max_new + 1] for this call's generated tokens (int32) and
        their log-probs (fp32; the last column takes what a row samples after it stopped inside a
        round, never read), and the call's sampling settings and stop ids."""
        self.generated = torch.zeros(num_outputs, max_new + 1, dtype=torch.int32, device=self.device)
        self.generated_logprobs = torch.zeros(num_outputs, max_new + 1, dtype=torch.float32, device=self.device)
        self.sampling = params
        ids = params.stop_token_ids
        if ids not in self._stop_ids:
            self._stop_ids[ids] = torch.tensor(ids, dtype=torch.int64, device=self.device)
        self.stop_ids = self._stop_ids[ids]

    def responses(self, lengths: list[int]) -> list[list[int]]:
        """Copy the generated tokens out (with `response_logprobs`, the call's two large device-to-host copies)."""
        host = self.generated.cpu().numpy()
        return [host[i, :n].tolist() for i, n in enumerate(lengths)]

    def response_logprobs(self, lengths: list[int]) -> list[torch.Tensor]:
        """The generated tokens' log-probs, [n] fp32 on the host per output row (own storage each)."""
        host = self.generated_logprobs.cpu()
        return [host[i, :n].clone() for i, n in enumerate(lengths)]

    # ------------------------------------------------------------------ prefill

    @torch.no_grad()
    def prefill(self, seqs: list[tuple[list[int], int, int, list[int]]], sample_rows: list[int]) -> torch.Tensor:
        """One packed forward over whole sequences, writing their k/v into the pool.

        Args:
            seqs: per packed sequence (prompt, out_row, num_generated_to_include, block table):
                its tokens are the prompt then the first tokens of its generated row.
            sample_rows: indices into `seqs` whose last position's logits are wanted.

        Returns:
            [len(sample_rows), V] logits in the compute dtype.
        """
        pieces, pos, slots, lens = [], [], [], []
        for prompt, out_row, num_gen, table in seqs:
            pieces.append(torch.tensor(prompt, dtype=torch.int64).to(self.device, non_blocking=True))
            if num_gen:
                pieces.append(self.generated[out_row, :num_gen].long())
            n = len(prompt) + num_gen
            p = np.arange(n)
            pos.append(p)
            slots.append(np.asarray(table, dtype=np.int64)[p // self.block_size] * self.block_size + p % self.block_size)
            lens.append(n)
        ids = torch.cat(pieces)
        positions = torch.from_numpy(np.concatenate(pos)).to(self.device)
        slot_map = torch.from_numpy(np.concatenate(slots)).to(self.device)
        cu_host = np.concatenate([[0], np.cumsum(lens)])
        cu = torch.from_numpy(cu_host).to(self.device, torch.int32)
        last = torch.from_numpy(cu_host[1:][sample_rows] - 1).to(self.device)
        cache = PrefillCache(self.kv, slot_map, self.prefill_backend, cu, max(lens))

        def head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return F.linear(hidden[last], weight)

        return self.model(ids, positions, cu, max(lens), cache=cache, head=head)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks, every layer's k and v (copy-on-write of forked prompts)."""
        if copies:
            src, dst = (torch.tensor(x, dtype=torch.int64, device=self.device) for x in zip(*copies))
            self.kv[:, :, dst] = self.kv[:, :, src]

    # ------------------------------------------------------------------ row state

    def add_rows(self, tokens: torch.Tensor, positions: list[int], num_new: list[int], limits: list[int],
                 out_rows: list[int], tables: list[list[int]]) -> None:
        """Append rows (in this order) after the live ones; `tokens` [m] are their pending tokens."""
        n, m = self.num_rows, len(positions)
        host = np.zeros((m, self.max_blocks_per_seq), dtype=np.int32)
        for i, t in enumerate(tables):
            host[i, : len(t)] = t
        put = lambda dst, values, dtype=torch.int64: dst[n : n + m].copy_(  # noqa: E731
            torch.as_tensor(values, dtype=dtype), non_blocking=False)
        self.input_ids[n : n + m] = tokens
        put(self.positions, positions)
        put(self.num_new, num_new)
        put(self.limits, limits)
        put(self.out_rows, out_rows)
        put(self.block_tables, host, torch.int32)
        self.done[n : n + m] = False
        self.num_rows = n + m

    def pending_tokens(self, out_rows: list[int], num_new: list[int]) -> torch.Tensor:
        """The last generated token of each (out_row, num_new): a recomputed sequence's pending token."""
        rows = torch.tensor(out_rows, dtype=torch.int64, device=self.device)
        cols = torch.tensor(num_new, dtype=torch.int64, device=self.device) - 1
        return self.generated[rows, cols].long()

    def record(self, first: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
        """Store the first tokens (sampled at a prefill) of rows first..first+len-1 and their
        log-probs [len] fp32, and check the stop rule there.

        The rows' num_new already counts the token (set by `add_rows`).
        Returns the rows' stop mask [len] bool (device).
        """
        rows = slice(first, first + tokens.shape[0])
        out_rows, cols = self.out_rows[rows], self.num_new[rows] - 1
        self.generated[out_rows, cols] = tokens.to(torch.int32)
        self.generated_logprobs[out_rows, cols] = logprobs
        return finished(tokens, self.num_new[rows], self.limits[rows], self.stop_ids)

    def set_blocks(self, entries: list[tuple[int, int, int]]) -> None:
        """Write (row, column, block) block-table entries (one host-to-device copy)."""
        if entries:
            r, c, b = self._to_device(torch.tensor(entries, dtype=torch.int64)).unbind(1)
            self.block_tables[r, c] = b.to(torch.int32)

    def set_shared_prefix(self, prefix_lens: np.ndarray, group_rows: np.ndarray) -> None:
        """The live rows' groups (`block_manager.shared_prefix_groups`, [num_rows] int32 each) for the
        decode steps that follow; every other row is in none. One host-to-device copy."""
        host = np.zeros((2, self.max_num_seqs), dtype=np.int32)
        host[0, : len(prefix_lens)], host[1, : len(group_rows)] = prefix_lens, group_rows
        both = self._to_device(torch.from_numpy(host))
        self.prefix_lens.copy_(both[0], non_blocking=True)
        self.group_rows.copy_(both[1], non_blocking=True)

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device without waiting for the stream: on CUDA through pinned memory
        (the caching host allocator keeps it until the copy ran), so a round can be planned while
        the one before it still runs."""
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def keep_rows(self, keep: np.ndarray) -> None:
        """Keep only these live rows, in this order, as rows 0..len-1; zero the rest (finished or
        preempted) and mark them done."""
        n, m = self.num_rows, len(keep)
        idx = self._to_device(torch.from_numpy(keep))
        for t in (self.input_ids, self.positions, self.num_new, self.limits, self.out_rows, self.block_tables):
            t[:m] = t[:n].index_select(0, idx)
            t[m:n] = 0
        self.done[:m] = self.done[:n].index_select(0, idx)
        self.done[m:n] = True
        if self.shared_prefix_min_rows:  # no group until the next `set_shared_prefix`
            self.prefix_lens.zero_()
            self.group_rows.zero_()
        self.num_rows = m

    # ------------------------------------------------------------------ decode rounds

    def start_round(self, uniform: torch.Tensor | None) -> None:
        """Before a round: each row's token count as it begins, step 0, the round's draws. The rows'
        done flags carry over (a row that stopped in a round whose results the host has not read
        yet runs this one without effect); padding rows are done.

        Args:
            uniform: [steps, num_rows] fp32, the round's draws (row j feeds step j); None when greedy.
        """
        n = self.num_rows
        self.round_start[:n] = self.num_new[:n]
        self.step.zero_()
        if uniform is not None:
            self.uniform[: uniform.shape[0], :n] = uniform

    @torch.no_grad()
    def decode_step(self, width: int) -> None:
        """One decode step of every live row: forward (writes each pending token's k/v), then the tail.

        `width`: block-table columns read without `static_shapes` (the longest live table).
        """
        n = self.num_rows
        if not self.static_shapes:
            self._decode_forward(n, width)
            self._decode_tail(n)
            return
        b = next(b for b in self.buckets if b >= n)
        if self.use_graphs:
            self.graphs[b].replay()
        else:
            self._decode_forward(b, self.max_blocks_per_seq)
        self._tail(b)

    def end_round(self, steps: int) -> RoundState:
        """After a round of `steps` steps: its tokens go to the output buffer, and the rows' state
        starts its copy to the host (`RoundState.read` waits for it: the round's one sync)."""
        n = self.num_rows
        start = self.round_start[:n]
        j = torch.arange(steps, device=self.device)[:, None]  # (steps, 1)
        # step j's token is token start + j of its row; after the row stopped, the scratch column
        cols = torch.where(j < self.num_new[:n] - start, start + j, self.generated.shape[1] - 1)  # (steps, n)
        rows = self.out_rows[:n].expand(steps, n)
        self.generated[rows, cols] = self.round_tokens[:steps, :n].to(torch.int32)
        self.generated_logprobs[rows, cols] = self.round_logprobs[:steps, :n]
        state = torch.stack((self.num_new[:n], self.done[:n].long(), self.num_new[:n] - start))
        if self.device.type != "cuda":
            return RoundState(state.numpy(), None)
        host = torch.empty(state.shape, dtype=state.dtype, pin_memory=True)
        host.copy_(state, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return RoundState(host.numpy(), copied)

    def _tail(self, b: int) -> None:
        key = (b, self.sampling.do_sample, self.sampling.temperature, self.sampling.top_k, self.sampling.top_p,
               self.sampling.stop_token_ids)
        graph = self.tail_graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        self._decode_tail(b)  # eagerly first: this step's real work, and Triton compiles outside the capture
        if self.use_graphs:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                self._decode_tail(b)
            self.tail_graphs[key] = graph

    def _decode_tail(self, b: int) -> None:
        """After a forward of rows 0..b-1: sample, record tokens and log-probs in the round buffers,
        count the token of each row not done, mark done the rows that now meet the stop rule, and
        make the token the pending one of the rows that go on (a stopped row keeps its last
        position, inside its blocks)."""
        uniform = self.step_uniform[:b] if self.sampling.do_sample else None  # the forward's decode_slots set it
        tokens, logprobs = sample_tokens(self.logits[:b], uniform, self.sampling, self.sample_impl)
        decode_tail(tokens, logprobs, self.stop_ids, self.limits[:b], self.step, self.round_tokens[:, :b],
                    self.round_logprobs[:, :b], self.num_new[:b], self.done[:b], self.positions[:b],
                    self.input_ids[:b], impl=self.row_state_impl)

    def _decode_forward(self, b: int, width: int) -> None:
        pos, tables = self.positions[:b], self.block_tables[:b, :width]
        slots, context = self.slots[:b], self.context_lens[:b]
        # a done row's slot: slot 0 of the null block, which nothing reads; and the step's uniforms for the tail
        decode_slots(pos, tables, self.done[:b], self.block_size, self.step, self.uniform[:, :b], slots, context,
                     self.step_uniform[:b], impl=self.row_state_impl)
        # the attention kernels launch as the layers around them do
        pdl = self.model.launches_with_pdl(b)
        # a group has two rows at least
        shared = SharedPrefix(self.prefix_lens[:b], self.group_rows[:b], self.max_group_rows) \
            if 0 < self.shared_prefix_min_rows <= b and b > 1 else None
        cache = DecodeCache(self.kv, slots, tables, context, self.attn_impl, pdl=pdl, shared=shared)
        out = self.logits[:b]

        def head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return torch.mm(hidden, weight.t(), out=out)

        self.model(self.input_ids[:b], pos, self._cu[: b + 1], 1, cache=cache, head=head)

