"""Admission, chunking, preemption order and counts of the scheduler, on host bookkeeping alone."""

import numpy as np
import pytest

from oreal_fast.rollout.engine.block_manager import BlockManager
from oreal_fast.rollout.engine.scheduler import Scheduler
from oreal_fast.rollout.engine.sequence import Sequence, Status, group_prompts


def make(num_blocks, *, block_size=4, max_num_seqs=64, max_prefill_batch=16, max_prefill_tokens=1000, watermark=0):
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(bm, max_num_seqs, max_prefill_batch, max_prefill_tokens, watermark), bm


def prompts(*specs):
    """(length, copies) -> prompt lists, distinct token values per prompt."""
    out = []
    for i, (n, k) in enumerate(specs):
        out += [[100 * i + t for t in range(n)]] * k
    return out


def test_identical_prompts_are_grouped_in_first_appearance_order():
    ps = [[1, 2], [3], [1, 2], [3], [4]]
    groups = group_prompts(ps, [5] * 5)
    assert [g.prompt for g in groups] == [[1, 2], [3], [4]]
    assert [[s.out_row for s in g.members] for g in groups] == [[0, 2], [1, 3], [4]]


def test_chunk_is_bounded_by_prompt_count_and_token_budget():
    s, _ = make(200, max_prefill_batch=2, max_prefill_tokens=25)
    s.start(group_prompts(prompts((10, 2), (10, 2), (10, 2)), [8] * 6))
    chunk = s.schedule_prefill()
    assert [len(it.seqs) for it in chunk] == [2, 2] and all(it.fresh for it in chunk)
    s.admit(chunk)
    s2, _ = make(200, max_prefill_batch=8, max_prefill_tokens=25)
    s2.start(group_prompts(prompts((30, 1), (10, 1)), [8] * 2))
    assert [it.num_tokens for it in s2.schedule_prefill()] == [30]  # a long first prompt goes alone
    assert [it.num_tokens for it in s2.schedule_prefill()] == [10]


def test_admission_leaves_blocks_for_each_samples_next_token():
    # prompt of 10 tokens (2 full blocks) x 4 samples needs 2 + 4 = 6 blocks; 5 are usable
    s, bm = make(6)
    s.start(group_prompts(prompts((10, 4), (3, 1)), [8] * 5))
    chunk = s.schedule_prefill()  # nothing runs: the group is split to what fits (3 samples)
    assert [len(it.seqs) for it in chunk] == [3]
    s.admit(chunk)
    assert bm.num_used == 5 and len(s.running) == 3
    assert s.schedule_prefill() == []  # now something runs: the rest waits rather than prefill twice
    assert len(s.waiting) == 2


def test_rows_limit_splits_a_group():
    s, _ = make(100, max_num_seqs=3)
    s.start(group_prompts(prompts((5, 5)), [8] * 5))
    chunk = s.schedule_prefill()
    assert [len(it.seqs) for it in chunk] == [3]
    s.admit(chunk)
    assert s.schedule_prefill() == [] and len(s.waiting[0].members) == 2


def test_preemption_takes_the_newest_first_counts_it_and_requeues_it_in_front():
    s, bm = make(7)  # 6 usable blocks of 4 tokens
    s.start(group_prompts(prompts((3, 1), (3, 1), (3, 1), (3, 1)), [20] * 4))
    chunk = s.schedule_prefill()
    assert len(chunk) == 4
    s.admit(chunk)
    assert bm.num_used == 4  # each sample's pending token (position 3) still fits its first block
    order = [seq.out_row for seq in s.running]
    assert s.prepare_round(1) == (4, 1, [])
    s.end_round(np.full(4, 2), np.zeros(4, dtype=bool))  # every pending token now at position 4
    rows, steps, entries = s.prepare_round(1)  # four new blocks, two free
    assert (rows, steps) == (3, 1) and s.stats.preemptions == 1
    assert [seq.out_row for seq in s.running] == order[:3]
    preempted = s.waiting[0]
    assert isinstance(preempted, Sequence) and preempted.out_row == order[3]
    assert preempted.status is Status.WAITING and preempted.block_table == [] and preempted.num_new == 2
    assert [(r, c) for r, c, _ in entries] == [(0, 1), (1, 1), (2, 1)]
    assert bm.num_used == 6
    # the first row finishes: its blocks return, the preempted sequence is recomputed next
    keep = s.finish(np.array([True, False, False]))
    assert keep.tolist() == [1, 2] and bm.num_used == 4
    chunk = s.schedule_prefill()
    assert len(chunk) == 1 and not chunk[0].fresh and chunk[0].num_tokens == 3 + 2 - 1
    s.admit(chunk)
    assert s.running[-1] is preempted and s.stats.recomputed_tokens == 4


def test_a_round_gets_the_blocks_of_every_position_it_may_write_up_to_each_limit():
    s, bm = make(100)
    # pending tokens at position 3 (prompt 3 + first token); limits 20, 2 and 7 new tokens
    s.start(group_prompts(prompts((3, 1), (3, 1), (3, 1)), [20, 2, 7]))
    s.admit(s.schedule_prefill())
    assert bm.num_used == 3
    rows, steps, entries = s.prepare_round(8)
    # 8 steps write positions 3..10 (blocks 0-2), the limited rows 3..3 and 3..8 (blocks 0 and 0-2)
    assert (rows, steps) == (3, 8)
    assert [(r, c) for r, c, _ in entries] == [(0, 1), (0, 2), (2, 1), (2, 2)]
    assert [len(q.block_table) for q in s.running] == [3, 1, 3] and bm.num_used == 7
    assert len({b for _, _, b in entries}) == 4
    # rows 1 and 2 stop inside the round (at their limit / on a stop token): released at its end
    keep = s.end_round(np.array([9, 2, 5]), np.array([False, True, True]))
    assert keep.tolist() == [0] and bm.num_used == 3 and s.num_new[0] == 9
    assert s.prepare_round(8)[1] == 8  # pending at 11: 8 steps write 11..18, two more blocks


def test_a_round_is_shortened_before_anything_is_preempted():
    s, bm = make(6)  # 5 usable blocks of 4 tokens
    s.start(group_prompts(prompts((3, 1), (3, 1)), [20, 20]))
    s.admit(s.schedule_prefill())  # 2 blocks used, 3 free; pending tokens at position 3
    rows, steps, entries = s.prepare_round(16)
    # s steps write positions 3..2+s: 5 steps need one more block per row, 9 steps two
    assert (rows, steps) == (2, 5) and s.stats.preemptions == 0 and len(entries) == 2
    assert s.prepare_round(16) == (2, 5, [])  # the same positions are covered already
    s.end_round(np.array([6, 6]), np.zeros(2, dtype=bool))  # pending at 8: one step needs 2 blocks, 1 free
    rows, steps, entries = s.prepare_round(16)
    # the newest row goes (3 free); the other may take 14 more tokens, of which 12 (positions 8..19) fit
    assert s.stats.preemptions == 1 and (rows, steps) == (1, 12)
    assert [len(q.block_table) for q in s.running] == [5] and bm.num_free == 0


def test_a_pool_too_small_for_one_sequence_is_an_error():
    s, _ = make(3)  # 2 usable blocks = 8 tokens
    s.start(group_prompts(prompts((9, 1)), [4]))
    with pytest.raises(RuntimeError, match="cannot hold one sequence of 10 tokens"):
        s.schedule_prefill()


def test_finished_rows_release_blocks_and_keep_order():
    s, bm = make(50)
    s.start(group_prompts(prompts((6, 3), (2, 1)), [9] * 4))
    s.admit(s.schedule_prefill())
    used = bm.num_used
    assert used == 1 + 3 + 1  # one shared full block, three last blocks, the short prompt's block
    keep = s.finish(np.array([False, True, False, True]))
    assert keep.tolist() == [0, 2] and [q.out_row for q in s.running] == [0, 2]
    assert bm.num_used == used - 2
    assert s.finish(np.array([False, False])) is None
    s.finish(np.array([True, True]))
    assert bm.num_used == 0 and s.done


def test_a_round_planned_ahead_of_an_unread_one_gets_the_blocks_the_read_would_have_given():
    """Overlapped rounds: planning with ahead = the unread round's steps gives the rows that went on
    the blocks, steps and entries that reading the round first (every row ahead tokens on) gives."""
    specs, limits = prompts((3, 1), (6, 1), (2, 1)), [30, 9, 25]
    overlapped, bm_a = make(100)
    read_first, bm_b = make(100)
    for s in (overlapped, read_first):
        s.start(group_prompts(specs, limits))
        s.admit(s.schedule_prefill())
        assert s.prepare_round(4)[1] == 4
    # rows 0 and 2 go on 4 tokens; row 1 (limit 9, 1 + 4 tokens so far) may still stop on a token
    read_first.end_round(np.array([5, 5, 5]), np.zeros(3, dtype=bool))
    assert overlapped.retire_at_limit(4) is None  # no row reaches its limit in the unread round
    ahead = overlapped.prepare_round(8, ahead=4)
    assert ahead == read_first.prepare_round(8) and ahead[1] == 8
    assert [len(q.block_table) for q in overlapped.running] == [len(q.block_table) for q in read_first.running]
    assert bm_a.num_used == bm_b.num_used
    assert overlapped.num_new[:3].tolist() == [1, 1, 1]  # the host's counts stay the last ones read


def test_rows_at_their_limit_in_an_unread_round_retire_before_it_is_read():
    s, bm = make(100)
    s.start(group_prompts(prompts((3, 1), (3, 1), (3, 1)), [20, 5, 9]))
    s.admit(s.schedule_prefill())  # one token each
    assert s.prepare_round(4)[1] == 4
    row1 = s.running[1]
    held = len(row1.block_table)
    assert held == 2  # positions 3..6 of the unread round
    # after the unread 4 steps row 1 holds its limit of 5 tokens, whatever it sampled
    used = bm.num_used
    keep = s.retire_at_limit(4)
    assert keep.tolist() == [0, 2] and [q.limit for q in s.running] == [20, 9]
    assert row1.status is Status.FINISHED and bm.num_used == used - held
    assert row1.num_new == 1  # the last count read: the round's read sets the true one
    # the read later brings every running row's true count, in the current row order
    assert s.end_round(np.array([5, 3]), np.array([False, True])).tolist() == [0]
    assert s.num_new[0] == 5 and s.running[0].limit == 20


def test_a_round_planned_ahead_preempts_nothing_and_waits_for_the_read():
    s, bm = make(6)  # 5 usable blocks of 4 tokens
    s.start(group_prompts(prompts((3, 1), (3, 1)), [20, 20]))
    s.admit(s.schedule_prefill())  # pending tokens at position 3, 3 blocks free
    assert s.prepare_round(5)[1] == 5  # positions 3..7: one more block each, 1 free
    assert s.prepare_round(16, ahead=5) is None  # positions 8.. need a block per row: the read decides
    assert s.stats.preemptions == 0 and len(s.running) == 2 and bm.num_free == 1
