"""KV-cache block ids: who holds which block, which are free. Host bookkeeping, no tensors.

The pool has `num_blocks` blocks of `block_size` token slots each (the model runner owns the
tensors). Block `NULL_BLOCK` (id 0) is never handed out: block-table entries past a sequence's
length point at it, and the padded rows of a CUDA-graph batch write their keys and values into it;
nothing reads what it holds.

Ref counts: a block's count is the number of block tables that hold it. A table is owned by one
sequence (or by a prompt group between its prefill and its fork); the manager holds no reference
itself. Prefix sharing gives a prompt's full blocks to each of its k samples, so their count is k;
a shared block is never written (the last, partial prompt block is copied for each sample before
it writes there: `fork`). A block whose count drops to 0 goes to the back of the free list, and
blocks are handed out from its front (oldest freed first).

Invariant: every block but the null block is either in the free list with count 0 or held by
`ref_count` tables; `num_free + num_used == num_blocks - 1` at all times.
"""

from __future__ import annotations

from collections import deque

import numpy as np

NULL_BLOCK = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"BlockManager: num_blocks = {num_blocks}, need the null block and at least one more")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    @property
    def capacity(self) -> int:
        """Blocks that can be handed out (all but the null block)."""
        return self.num_blocks - 1

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks, each with ref count 1 (held by the caller's table)."""
        if n > len(self._free):
            raise RuntimeError(f"BlockManager: {n} blocks asked, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self.ref_counts[b] = 1
        self.peak_used = max(self.peak_used, self.num_used)
        return blocks

    def release(self, table: list[int]) -> None:
        """Drop one reference to every block of `table` (the table is then empty)."""
        for b in table:
            count = self.ref_counts[b] - 1
            if count < 0 or b == NULL_BLOCK:
                raise RuntimeError(f"BlockManager: block {b} released more often than it was held")
            self.ref_counts[b] = count
            if count == 0:
                self._free.append(b)
        table.clear()

    def fork_cost(self, num_tokens: int, n: int) -> int:
        """Blocks `fork` allocates for n samples of a prompt of `num_tokens` tokens."""
        return (n - 1) if num_tokens % self.block_size else 0

    def fork(self, table: list[int], num_tokens: int, n: int) -> tuple[list[list[int]], list[tuple[int, int]]]:
        """Share a prefilled prompt's table among n samples.

        Args:
            table: the prompt's blocks (one reference each, held by the caller), covering
                `num_tokens` tokens; the caller's references pass to the first sample.
            num_tokens: prompt length.
            n: number of samples.

        Returns:
            (tables, copies): n tables, the first being `table` itself; every table holds the
            full blocks (their count is now n); when the last block is partial, samples 1..n-1
            get a fresh block each, and `copies` lists the (source, destination) block pairs whose
            content the runner must copy before any sample writes.
        """
        full = num_tokens // self.block_size
        partial = num_tokens % self.block_size != 0
        fresh = self.allocate(n - 1) if partial else []
        for b in table[:full]:
            self.ref_counts[b] += n - 1
        tables = [table] + [table[:full] + ([fresh[i]] if partial else []) for i in range(n - 1)]
        copies = [(table[full], f) for f in fresh]
        return tables, copies


def shared_prefix_groups(tables: list[list[int]], block_size: int, max_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Groups of consecutive rows whose block tables begin with the same blocks: the samples of one
    prompt, which the prefix cache forked from one prefill, for decode attention to read their
    shared blocks once per group (`kernels.paged_attention.SharedPrefix`).

    A group is a run of 2 to `max_rows` rows whose tables agree on at least their first block; its
    prefix is the blocks all of them share. Those blocks are held by every table of the group, so
    their count is above 1 and they are never written (the fork copies a prompt's partial block):
    full, in every row's context, and fixed for as long as the rows run.

    Args:
        tables: each row's block table, in row order.
        block_size: token slots per block.
        max_rows: the most rows in one group (a longer run is cut into groups of at most this many).

    Returns:
        (prefix_lens, group_rows), [len(tables)] int32 each: the tokens each row's group shares (0 for a
        row in no group), and the group's row count at its first row (0 at every other row).
    """
    n = len(tables)
    prefix_lens, group_rows = np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32)
    first = 0
    while first < n:
        lead = tables[first]
        shared, end = len(lead), first + 1
        while end < n and end - first < max_rows:
            table, common = tables[end], shared
            if table[:shared] != lead[:shared]:  # the common case, the whole prefix equal, costs one compare
                common = next((i for i, (a, b) in enumerate(zip(lead[:shared], table)) if a != b),
                              min(shared, len(table)))
            if common == 0:
                break
            shared, end = common, end + 1
        if end - first >= 2:
            prefix_lens[first:end] = shared * block_size
            group_rows[first] = end - first
        first = end
    return prefix_lens, group_rows
