"""Which samples run: admission into the KV pool, prefill or decode this step, preemption.

Each engine step is either a prefill of waiting work (when some fits) or one decode step of every
running sequence. Waiting work is first-in first-out and holds two kinds of item: prompt groups not
yet started (the k samples of a prompt, prefilled once and forked) and preempted sequences (put
back at the front, recomputed as a fresh prompt of their cached tokens). A prefill chunk takes
whole items from the front while they fit: at most `max_prefill_batch` items and
`max_prefill_tokens` tokens (a first item longer than that goes alone), rows under
`max_num_seqs`, and the blocks every admitted sample needs for its next token while
`watermark_blocks` stay free. It stops at the first item that does not fit (no overtaking); a
group that fits only in part is split when the rows run out or when nothing else runs.

Before a decode step, every running sequence whose pending token starts a new block gets one; when
the pool runs out, the newest running sequence (largest `admit_order`, the last row) is preempted
by recompute until the rest fit, as vLLM does: its blocks are released and it waits again.

Running sequences are kept in row order: row i of the model runner's device state is
`running[i]`, admission appends rows, finishing removes rows (order kept), preemption removes
the last rows. `prompt_lens` and `num_new` mirror the rows on the host, so lengths are known
without reading a token.

Not here: tensors (`model_runner`), the loop (`engine`).
Invariant: every block a sequence holds is in its table and released exactly once (when it
finishes or is preempted); after `generate`, every block is free again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from oreal_fast.rollout.engine.block_manager import BlockManager
from oreal_fast.rollout.engine.sequence import PromptGroup, Sequence, Status


@dataclass
class PrefillItem:
    """One packed sequence of a prefill chunk: a group's prompt (`fresh`: the first token of each
    member is sampled from its last position) or a preempted sequence's cached tokens (not fresh:
    its pending token is fed by the next decode step)."""

    seqs: list[Sequence]
    table: list[int]  # blocks the prefill writes, held by this item until `admit`
    num_tokens: int
    fresh: bool


@dataclass
class SchedulerStats:
    preemptions: int = 0
    prompt_tokens: int = 0  # prompt tokens of every sample admitted fresh
    prompt_tokens_prefilled: int = 0  # prompt tokens actually run through a prefill
    recomputed_tokens: int = 0  # tokens prefilled again after a preemption
    kv_blocks_saved: int = 0  # prompt blocks shared instead of allocated per sample
    peak_blocks_used: int = 0


@dataclass
class Scheduler:
    blocks: BlockManager
    max_num_seqs: int
    max_prefill_batch: int
    max_prefill_tokens: int
    watermark_blocks: int
    waiting: deque = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    stats: SchedulerStats = field(default_factory=SchedulerStats)

    def __post_init__(self) -> None:
        self.prompt_lens = np.zeros(self.max_num_seqs, dtype=np.int64)
        self.num_new = np.zeros(self.max_num_seqs, dtype=np.int64)
        self._admissions = 0

    def start(self, groups: list[PromptGroup]) -> None:
        """A new `generate` call: everything waits, nothing runs, counters restart."""
        if self.running or self.waiting or self.blocks.num_used:
            raise RuntimeError("Scheduler.start: the previous generate left work or blocks behind")
        self.waiting.extend(groups)
        self.stats = SchedulerStats()
        self.blocks.peak_used = 0

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    def max_table_len(self) -> int:
        """Blocks of the longest running sequence (the eager decode reads this many columns)."""
        n = len(self.running)
        return self.blocks.blocks_for(int((self.prompt_lens[:n] + self.num_new[:n]).max())) if n else 1

    # ------------------------------------------------------------------ prefill

    def schedule_prefill(self) -> list[PrefillItem]:
        """Take waiting work into one prefill chunk (possibly empty); allocates its prompt blocks."""
        chunk: list[PrefillItem] = []
        tokens = rows = 0
        free = self.blocks.num_free - self.watermark_blocks
        while self.waiting and len(chunk) < self.max_prefill_batch:
            item = self.waiting[0]
            alone = not chunk and not self.running
            if isinstance(item, PromptGroup):
                P, n = len(item.prompt), len(item.members)
                full = P // self.blocks.block_size
                if chunk and tokens + P > self.max_prefill_tokens:
                    break
                rows_left = self.max_num_seqs - len(self.running) - rows
                # the full prompt blocks once, then one block per sample for its next token
                n_fit = min(n, rows_left, max(0, free - full))
                if n_fit < 1:
                    self._check_fits_alone(alone, P + 1)
                    break
                if n_fit < n and not (alone or n_fit == rows_left):
                    break  # wait for blocks rather than prefill the prompt twice
                if n_fit < n:
                    item = item.split(n_fit)
                else:
                    self.waiting.popleft()
                need, length = full + n_fit, P
            else:
                length = item.length - 1  # the cached part; the pending token is decoded next
                need = self.blocks.blocks_for(item.length)
                if chunk and tokens + length > self.max_prefill_tokens:
                    break
                if rows + len(self.running) >= self.max_num_seqs or need > free:
                    self._check_fits_alone(alone, item.length)
                    break
                self.waiting.popleft()
            free -= need
            rows += len(item.members) if isinstance(item, PromptGroup) else 1
            tokens += length
            table = self.blocks.allocate(self.blocks.blocks_for(length))
            if isinstance(item, PromptGroup):
                chunk.append(PrefillItem(item.members, table, length, fresh=True))
            else:
                chunk.append(PrefillItem([item], table, length, fresh=False))
        return chunk

    def _check_fits_alone(self, alone: bool, length: int) -> None:
        if alone:
            raise RuntimeError(
                f"the KV pool ({self.blocks.capacity} blocks of {self.blocks.block_size} tokens, "
                f"{self.watermark_blocks} kept free) cannot hold one sequence of {length} tokens")

    def admit(self, chunk: list[PrefillItem]) -> list[tuple[int, int]]:
        """After the chunk's prefill: fork groups, append every sample as a running row.

        Returns:
            (source, destination) block copies the runner must make before the next decode.
        """
        copies: list[tuple[int, int]] = []
        for item in chunk:
            if item.fresh:
                tables, item_copies = self.blocks.fork(item.table, item.num_tokens, len(item.seqs))
                copies += item_copies
                self.stats.prompt_tokens += item.num_tokens * len(item.seqs)
                self.stats.prompt_tokens_prefilled += item.num_tokens
                self.stats.kv_blocks_saved += (len(item.seqs) - 1) * (item.num_tokens // self.blocks.block_size)
            else:
                tables = [item.table]
                self.stats.recomputed_tokens += item.num_tokens
            for seq, table in zip(item.seqs, tables):
                row = len(self.running)
                seq.block_table, seq.status, seq.admit_order = table, Status.RUNNING, self._admissions
                if item.fresh:
                    seq.num_new = 1  # its first token, sampled from the prefill
                self._admissions += 1
                self.prompt_lens[row], self.num_new[row] = seq.num_prompt, seq.num_new
                self.running.append(seq)
        self.stats.peak_blocks_used = max(self.stats.peak_blocks_used, self.blocks.peak_used)
        return copies

    # ------------------------------------------------------------------ decode

    def prepare_decode(self) -> tuple[int, list[tuple[int, int, int]]]:
        """Give every running sequence the block its pending token is written to.

        Returns:
            (num_rows, entries): the rows left after any preemption (the runner drops the rest),
            and (row, column, block) block-table entries to write on the device.
        """
        bs = self.blocks.block_size
        while True:
            n = len(self.running)
            positions = self.prompt_lens[:n] + self.num_new[:n] - 1  # of each pending token
            rows = [int(r) for r in np.flatnonzero(positions % bs == 0)
                    if len(self.running[r].block_table) <= positions[r] // bs]
            if self.blocks.can_allocate(len(rows)):
                break
            if n == 1:
                raise RuntimeError("the KV pool cannot hold one sequence: this cannot happen when it holds "
                                   "max_model_len tokens (the engine checks that)")
            self._preempt_last()
        entries = []
        for r, block in zip(rows, self.blocks.allocate(len(rows))):
            table = self.running[r].block_table
            entries.append((r, len(table), block))
            table.append(block)
        self.stats.peak_blocks_used = max(self.stats.peak_blocks_used, self.blocks.peak_used)
        return len(self.running), entries

    def _preempt_last(self) -> None:
        seq = self.running.pop()
        seq.num_new = int(self.num_new[len(self.running)])
        self.blocks.release(seq.block_table)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1

    def advance(self) -> None:
        """Every running sequence got one token this decode step."""
        self.num_new[: len(self.running)] += 1

    def finish(self, done: np.ndarray) -> np.ndarray | None:
        """Release the rows marked done.

        Args:
            done: [num_rows] bool, from the step's stop check.

        Returns:
            The kept rows in order (the runner gathers its device state by them), or None when
            no row finished.
        """
        finished = np.flatnonzero(done)
        if finished.size == 0:
            return None
        for r in finished:
            seq = self.running[r]
            seq.num_new = int(self.num_new[r])
            self.blocks.release(seq.block_table)
            seq.status = Status.FINISHED
        keep = np.flatnonzero(~done)
        self.running = [self.running[r] for r in keep]
        m = keep.size
        self.prompt_lens[:m], self.num_new[:m] = self.prompt_lens[keep], self.num_new[keep]
        return keep
