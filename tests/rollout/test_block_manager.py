"""Block ids and ref counts: allocation order, release, prefix forks with copy-on-write; the groups of
rows that share a prompt's blocks."""

import numpy as np
import pytest

from oreal_fast.rollout.engine.block_manager import NULL_BLOCK, BlockManager, shared_prefix_groups


def test_allocate_hands_out_every_block_but_the_null_block_then_refuses():
    bm = BlockManager(num_blocks=5, block_size=4)
    got = bm.allocate(4)
    assert sorted(got) == [1, 2, 3, 4] and NULL_BLOCK not in got
    assert (bm.num_free, bm.num_used, bm.capacity) == (0, 4, 4)
    assert [bm.ref_counts[b] for b in got] == [1, 1, 1, 1]
    with pytest.raises(RuntimeError, match="1 blocks asked, 0 free"):
        bm.allocate(1)


def test_released_blocks_come_back_oldest_freed_first():
    bm = BlockManager(num_blocks=6, block_size=4)
    a, b = bm.allocate(2), bm.allocate(3)
    bm.release(b)
    bm.release(a)
    assert a == [] and b == []  # a released table is emptied
    assert bm.allocate(5) == [3, 4, 5, 1, 2]
    assert bm.peak_used == 5


def test_releasing_a_block_twice_is_refused():
    bm = BlockManager(num_blocks=3, block_size=4)
    table = bm.allocate(1)
    copy = list(table)
    bm.release(table)
    with pytest.raises(RuntimeError, match="released more often"):
        bm.release(copy)


def test_fork_of_a_partial_prompt_shares_full_blocks_and_copies_the_last():
    bm = BlockManager(num_blocks=12, block_size=4)
    table = bm.allocate(bm.blocks_for(10))  # 10 tokens: 2 full blocks + 2 tokens in a third
    full, last = table[:2], table[2]
    assert bm.fork_cost(10, 4) == 3
    tables, copies = bm.fork(table, 10, 4)
    assert tables[0] is table and tables[0] == full + [last]
    assert all(t[:2] == full for t in tables) and len({t[2] for t in tables}) == 4
    assert copies == [(last, t[2]) for t in tables[1:]]
    assert [bm.ref_counts[b] for b in full] == [4, 4]
    assert [bm.ref_counts[t[2]] for t in tables] == [1, 1, 1, 1]
    assert bm.num_used == 2 + 4
    for t in tables:
        bm.release(t)
    assert bm.num_used == 0 and bm.num_free == 11 and not any(bm.ref_counts)


def test_fork_of_a_whole_block_prompt_copies_nothing():
    bm = BlockManager(num_blocks=8, block_size=4)
    table = bm.allocate(2)  # 8 tokens fill both blocks: the samples' next tokens start new blocks
    assert bm.fork_cost(8, 3) == 0
    tables, copies = bm.fork(table, 8, 3)
    assert copies == [] and tables == [table] * 3 and bm.num_used == 2
    assert [bm.ref_counts[b] for b in table] == [3, 3]
    for t in tables[1:]:
        bm.release(t)
    assert [bm.ref_counts[b] for b in table] == [1, 1]


def test_shared_prefix_groups_are_runs_of_rows_whose_tables_begin_alike():
    tables = [[1, 2, 3, 9], [1, 2, 3, 10], [1, 2, 4, 11],  # a run sharing 2 blocks (the third row shares less)
              [5, 6],  # alone
              [7, 12], [7, 13],  # a run sharing 1 block
              [8, 14]]  # alone at the end
    prefix_lens, group_rows = shared_prefix_groups(tables, 16, max_rows=8)
    assert prefix_lens.tolist() == [32, 32, 32, 0, 16, 16, 0]
    assert group_rows.tolist() == [3, 0, 0, 0, 2, 0, 0]
    assert prefix_lens.dtype == group_rows.dtype == np.int32


def test_shared_prefix_groups_cut_long_runs_and_leave_a_lone_row_out():
    tables = [[1, 2, 3, 10 + r] for r in range(5)]  # 5 samples of one prompt, 3 shared blocks
    prefix_lens, group_rows = shared_prefix_groups(tables, 4, max_rows=2)
    assert group_rows.tolist() == [2, 0, 2, 0, 0]
    assert prefix_lens.tolist() == [12, 12, 12, 12, 0]
    assert [a.tolist() for a in shared_prefix_groups([], 4, max_rows=2)] == [[], []]
