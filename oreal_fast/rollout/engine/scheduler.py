"""Which samples run: admission into the KV pool, prefill or a decode round this step, preemption.

Each engine step is either a prefill of waiting work (when some fits) or one round of decode steps
of every running sequence. Waiting work is first-in first-out and holds two kinds of item: prompt
groups not yet started (the k samples of a prompt, prefilled once and forked) and preempted
sequences (put back at the front, recomputed as a fresh prompt of their cached tokens). A prefill
chunk takes whole items from the front while they fit: at most `max_prefill_batch` items and
`max_prefill_tokens` tokens (a first item longer than that goes alone), rows under
`max_num_seqs`, and the blocks every admitted sample needs for its next token while
`watermark_blocks` stay free. It stops at the first item that does not fit (no overtaking); a
group that fits only in part is split when the rows run out or when nothing else runs.

Before a decode round, every running sequence gets the blocks of every position the round may
write: its pending token's and those of the tokens it may still sample in the round, never past
its limit (`prepare_round`). The round is shortened before anything is preempted; when not even
one step fits, the newest running sequence (largest `admit_order`, the last row) is preempted by
recompute until the rest fit, as vLLM does: its blocks are released and it waits again. So
preemption, admission and release happen at round boundaries only; a row that stops inside a
round keeps its blocks until the host reads the round (`end_round`).

Overlapped rounds (the engine's `overlap_rounds`): the next round is planned and launched before
the host reads the last one. Its rows' counts are then known up to which of them stopped
(`prepare_round(ahead=...)`); rows that reach their limit in the unread round are released before
the plan (`retire_at_limit`), rows that sampled a stop token one round late, and nothing is
preempted until the unread round has been read.

Running sequences are kept in row order: row i of the model runner's device state is
`running[i]`, admission appends rows, finishing removes rows (order kept), preemption removes
the last rows. `prompt_lens`, `num_new` and `limits` mirror the rows on the host; `num_new` is
read back from the device once per round, since a row that stops inside a round takes fewer
tokens than the round's steps.

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
        self.limits = np.zeros(self.max_num_seqs, dtype=np.int64)
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
        """Blocks of the longest block table of a running sequence (the eager decode reads this many columns)."""
        return max((len(s.block_table) for s in self.running), default=1)

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
                self.prompt_lens[row], self.num_new[row], self.limits[row] = seq.num_prompt, seq.num_new, seq.limit
                self.running.append(seq)
        self.stats.peak_blocks_used = max(self.stats.peak_blocks_used, self.blocks.peak_used)
        return copies

    # ------------------------------------------------------------------ decode

    def prepare_round(self, max_steps: int, ahead: int = 0) -> tuple[int, int, list[tuple[int, int, int]]] | None:
        """Give every running sequence the blocks of the positions the next decode round writes.

        In a round of s steps a row writes the positions of its pending token and of the next
        min(s, left) - 1 tokens, left = limit - num_new being the tokens it may still take (a row
        stops at its limit inside the round). The round takes the most steps, at most `max_steps`
        and at most the largest `left`, whose blocks fit the free pool; when not one step fits, the
        newest running sequence is preempted and the rest are tried again.

        `ahead` > 0: the round follows a launched round of `ahead` steps whose results are not read
        yet. A row that did not stop in it took exactly `ahead` tokens (each step gives every live
        row one), so the round is planned from num_new + ahead; a row that did stop is planned as if
        it went on (its blocks are released when the read shows it stopped). Rows that reach their
        limit within those steps must be retired first (`retire_at_limit`). Nothing is preempted
        then: when not one step fits, None (read the launched round, then plan with ahead 0).

        Returns:
            (num_rows, steps, entries): the rows left after any preemption (the runner drops the
            rest), the round's steps, and (row, column, block) block-table entries to write on
            the device; or None (above).
        """
        while True:
            n = len(self.running)
            need = self._round_blocks(n, max_steps, ahead)  # (n, steps): new blocks for a round of 1, 2, ... steps
            fits = np.flatnonzero(need.sum(axis=0) <= self.blocks.num_free)  # a prefix: need grows with steps
            if fits.size:
                break
            if ahead:
                return None
            if n == 1:
                raise RuntimeError("the KV pool cannot hold one sequence: this cannot happen when it holds "
                                   "max_model_len tokens (the engine checks that)")
            self._preempt_last()
        steps = int(fits[-1]) + 1
        need = need[:, steps - 1]
        fresh = self.blocks.allocate(int(need.sum()))
        entries, i = [], 0
        for r in np.flatnonzero(need):
            table = self.running[r].block_table
            k = int(need[r])
            entries += [(int(r), len(table) + j, b) for j, b in enumerate(fresh[i : i + k])]
            table += fresh[i : i + k]
            i += k
        self.stats.peak_blocks_used = max(self.stats.peak_blocks_used, self.blocks.peak_used)
        return n, steps, entries

    def _round_blocks(self, n: int, max_steps: int, ahead: int) -> np.ndarray:
        """[n, S] int64: new blocks row r needs for a round of s + 1 steps, S = min(max_steps, largest
        left), its rows `ahead` tokens on (`prepare_round`)."""
        num_new = self.num_new[:n] + ahead
        pending = self.prompt_lens[:n] + num_new - 1  # position of each pending token
        left = self.limits[:n] - num_new  # >= 1: a row at its limit has finished (or was retired)
        steps = np.arange(1, min(max_steps, int(left.max())) + 1)
        last = pending[:, None] + np.minimum(steps[None, :], left[:, None]) - 1  # last position written
        held = np.array([len(s.block_table) for s in self.running[:n]], dtype=np.int64)
        return np.maximum(last // self.blocks.block_size + 1 - held[:, None], 0)

    def _preempt_last(self) -> None:
        seq = self.running.pop()
        seq.num_new = int(self.num_new[len(self.running)])
        self.blocks.release(seq.block_table)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1

    def retire_at_limit(self, ahead: int) -> np.ndarray | None:
        """Release the rows that reach their limit within a launched round of `ahead` steps whose
        results are not read yet: whatever they sample, they have stopped by its end. Their
        `Sequence.num_new` is the last one read; the round's read sets the true one (a stop token
        may have ended a row earlier).

        Returns:
            The kept rows in order, or None when no row retires (as `finish`).
        """
        n = len(self.running)
        return self.finish(self.num_new[:n] + ahead >= self.limits[:n])

    def end_round(self, num_new: np.ndarray, done: np.ndarray) -> np.ndarray | None:
        """After a decode round: the rows' new-token counts and stop mask, read from the device;
        releases the rows that stopped (see `finish`).

        Args:
            num_new: [num_rows] int64, tokens each row holds now (the pending one included).
            done: [num_rows] bool, rows that stopped in the round.
        """
        self.num_new[: len(self.running)] = num_new
        return self.finish(done)

    def finish(self, done: np.ndarray) -> np.ndarray | None:
        """Release the rows marked done.

        Args:
            done: [num_rows] bool, from the stop check.

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
        for mirror in (self.prompt_lens, self.num_new, self.limits):
            mirror[:m] = mirror[keep]
        return keep
