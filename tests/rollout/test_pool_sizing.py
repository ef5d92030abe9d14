"""The KV pool sized from the measured step (`engine.pool_sizing`): the rule's arithmetic on hand-worked
numbers, the largest need kept, the cap, the override, and an engine resized between calls (both
ways, with a fake memory reader) that gives the same greedy tokens."""

from dataclasses import dataclass

import pytest
import torch

from oreal_fast.rollout import SamplingParams
from oreal_fast.rollout.build import pool_sizer
from oreal_fast.rollout.engine import PoolSizer
from oreal_fast.rollout.engine.pool_sizing import next_pool_bytes

from test_build import _cfg
from test_engine import PROMPTS, assert_pool_empty, engine, greedy

GIB = 2**30


@dataclass
class FakeMemory:
    limit: int

    def limit_bytes(self) -> int:
        return self.limit


def gib(x: float) -> int:
    return int(x * GIB)


# (pool, need, limit, expected) in GiB, min 0.5 and max 30 unless the case says; margin is
# max(1, 5 % of the limit): 2 at 40, 7.05 at 141.
RULE_CASES = {
    # limit 40 - need 20 - margin 2 = 18; a gain of 10 is past 10 % of 8
    "grows_from_the_start_default": (8, 20, 40, 18),
    # target 18: a gain of 0.5 is under 10 % of 17.5, and 17.5 + 20 + 1 <= 40 leaves half the margin
    "small_gain_is_not_worth_a_resize": (17.5, 20, 40, 17.5),
    # the need grew by 1 = half the margin: 18 + 21 + 1 = 40 still fits
    "need_grew_within_half_the_margin": (18, 21, 40, 18),
    # 18 + 21.5 + 1 > 40: shrink to 40 - 21.5 - 2 = 16.5
    "need_grew_into_the_margin": (18, 21.5, 40, 16.5),
    # 40 - 39 - 2 < 0: the engine's minimum
    "never_below_the_minimum": (18, 39, 40, 0.5),
    # 141 - 20 - 7.05 = 113.95, but the engine can use no more than 30
    "never_past_what_the_engine_uses": (8, 20, 141, 30),
}


@pytest.mark.parametrize("case", RULE_CASES)
def test_rule_arithmetic(case):
    pool, need, limit, expected = RULE_CASES[case]
    got = next_pool_bytes(gib(pool), gib(need), gib(limit), min_bytes=gib(0.5), max_bytes=gib(30))
    assert got == pytest.approx(gib(expected), abs=2)


@pytest.mark.parametrize("need", [0, 10, 25, 37.5])
@pytest.mark.parametrize("pool", [0.5, 5, 20, 35])
def test_a_picked_pool_leaves_half_the_margin_under_the_cap(pool, need):
    limit = 40
    got = next_pool_bytes(gib(pool), gib(need), gib(limit), min_bytes=gib(0.5), max_bytes=gib(100))
    assert got + gib(need) + gib(1) <= gib(limit) or got == gib(0.5)


def test_the_sizer_keeps_the_largest_need_and_reads_the_limit_each_time():
    memory = FakeMemory(gib(40))
    sizer = PoolSizer(memory)
    kw = dict(min_bytes=gib(0.5), max_bytes=gib(100))
    assert sizer.next_bytes(gib(8), gib(20), **kw) == gib(18)
    # a step that needed less does not make room: the largest need stays 20
    assert sizer.next_bytes(gib(18), gib(5), **kw) == gib(18) and sizer.need_bytes == gib(20)
    memory.limit = gib(80)  # e.g. another process released its memory: 80 - 20 - 4 = 56
    assert sizer.next_bytes(gib(18), gib(5), **kw) == gib(56)


def test_an_explicit_kv_cache_gib_turns_auto_sizing_off():
    cuda = torch.device("cuda", 0)
    assert isinstance(pool_sizer(_cfg(), cuda, training=True), PoolSizer)
    assert pool_sizer(_cfg(kv_cache_gib=4.0), cuda, training=True) is None
    assert pool_sizer(_cfg(), cuda, training=False) is None  # evaluation: no steps to measure
    assert pool_sizer(_cfg(), torch.device("cpu"), training=True) is None


def test_without_a_sizer_fit_memory_changes_nothing(models):
    _, ours = models
    e = engine(ours)
    before = e.pool_bytes
    e.fit_memory({"gen": 1e-6, "rl": 1e-6})
    assert e.pool_bytes == before and e.runner.kv.shape[2] == e.blocks.num_blocks


@pytest.mark.parametrize("keep_cache", [True, False])
def test_resized_between_calls_the_engine_gives_the_same_greedy_tokens(models, keep_cache):
    """Shrunk to its minimum (one 64-token sequence: it preempts), then grown to the most it can
    use (16 sequences), the engine generates what it did at its first size; the step's need is
    the peak besides the pool of the phases the pool was allocated in (gen, and rl with keep_cache)."""
    _, ours = models
    memory = FakeMemory(gib(40))
    e = engine(ours, blocks=100, max_num_seqs=16, decode_steps_per_round=4, keep_cache=keep_cache)
    e.sizer = PoolSizer(memory)
    smallest, largest = e.pool_bytes_range()
    assert smallest == 16 * e.block_bytes  # 16 blocks of 4 hold 64 tokens; the 1 % watermark rounds to 0 blocks
    assert largest == 258 * e.block_bytes  # 16 sequences of 16 blocks beside the 1 % watermark (2 blocks)
    expected = e.generate(PROMPTS, greedy(30), torch.Generator())
    assert e.stats()["preemptions"] == 0 and e.stats()["kv_pool_gib"] == 100 * e.block_bytes / GIB

    def peaks(need: int) -> dict[str, float]:
        """Phase peaks (GiB) whose need besides the pool is 2 x `need`."""
        pool = e.pool_bytes / GIB
        if keep_cache:  # the pool is in both phases; the RL phase needs more
            return {"gen": need / GIB + pool, "rl": 2 * need / GIB + pool}
        return {"gen": 2 * need / GIB + pool, "rl": 100.0}  # without the pool, the RL phase does not bound it

    e.fit_memory(peaks(gib(19.5)))  # 19.5 x 2 = 39 GiB needed: within half the margin of 40
    assert e.pool_bytes == smallest and e.blocks.num_blocks == 16 + 1
    assert e.runner.allocated == keep_cache
    assert e.generate(PROMPTS, greedy(30), torch.Generator()) == expected
    assert e.stats()["preemptions"] > 0 and e.stats()["kv_pool_gib"] == smallest / GIB
    assert_pool_empty(e)

    memory.limit = gib(80)  # room again: the target 80 - 39 - 4 is past what 16 sequences use
    e.fit_memory(peaks(gib(1)))
    assert e.pool_bytes == largest and e.runner.allocated == keep_cache
    assert not keep_cache or e.runner.kv.shape[2] == 258 + 1  # the null block besides
    assert e.generate(PROMPTS, greedy(30), torch.Generator()) == expected
    assert e.stats()["preemptions"] == 0 and e.stats()["kv_pool_gib"] == largest / GIB
    assert_pool_empty(e)


def test_a_pool_cannot_be_resized_while_it_holds_blocks(models):
    _, ours = models
    e = engine(ours)
    e.blocks.allocate(2)
    with pytest.raises(RuntimeError, match="2 KV blocks are in use"):
        e.resize_pool(50 * e.block_bytes)


def test_a_memory_state_gives_a_new_engine_the_pool_and_need_the_first_reached(models):
    """What a resume state carries: a second engine built at the start size takes the first's
    resized pool and largest need, and samples what the first samples at that size (the pool
    preempts there, so its size decides which rows share a round)."""
    _, ours = models
    first = engine(ours, blocks=100, max_num_seqs=16, decode_steps_per_round=4)
    first.sizer = PoolSizer(FakeMemory(gib(40)))
    smallest, _ = first.pool_bytes_range()
    pool = first.pool_bytes
    peak = 39 + pool / GIB  # 39 GiB besides the pool, in both phases: the minimum pool
    first.fit_memory({"gen": peak, "rl": peak})
    assert first.pool_bytes == smallest
    state = first.memory_state()
    assert state == {"pool_bytes": smallest, "need_bytes": first.sizer.need_bytes}
    assert abs(state["need_bytes"] - gib(39)) < 2**10
    params = SamplingParams(max_new_tokens=30, max_length=64, temperature=1.0, top_p=0.9)
    expected = first.generate(PROMPTS, params, torch.Generator().manual_seed(3))
    assert first.stats()["preemptions"] > 0

    second = engine(ours, blocks=100, max_num_seqs=16, decode_steps_per_round=4)
    second.sizer = PoolSizer(FakeMemory(gib(40)))
    second.load_memory_state({})  # a resume state from before the pool was sized: nothing changes
    assert second.pool_bytes == pool
    second.load_memory_state(state)
    assert second.pool_bytes == smallest and second.sizer.need_bytes == state["need_bytes"]
    assert second.generate(PROMPTS, params, torch.Generator().manual_seed(3)) == expected
    assert engine(ours).memory_state() == {}  # no sizer (kv_cache_gib set): nothing to carry
