"""The paged engine against the plain sampler (greedy, token for token), its stop rule, preemption,
prefix sharing, reproducibility, its uniform stream and the sampled distribution of first tokens
(chi-square); decode runs in rounds of several steps (`decode_steps_per_round`)."""

import dataclasses
import math
import os

import pytest
import torch
import torch.nn.functional as F

from oreal_fast.kernels.paged_attention import paged_decode_attention
from oreal_fast.kernels.sampling import sample_from_logits_eager
from oreal_fast.rollout import EngineConfig, PagedEngine, PlainSampler, SamplingParams, filter_logits
from oreal_fast.rollout.engine import model_runner

BASE = [[3, 17, 8, 40, 2], [9], [50, 1, 1, 33, 12, 7, 26, 5, 44], [21, 22]]
# k copies in a row as the trainer passes them, plus singles
PROMPTS = [BASE[0]] * 3 + [BASE[1]] + [BASE[2]] * 4 + [BASE[3]]


def greedy(max_new, max_length=64, stop=()):
    return SamplingParams(max_new_tokens=max_new, max_length=max_length, do_sample=False, stop_token_ids=stop)


def block_bytes(model, block_size):
    c = model.config
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * 4


def engine(model, *, block_size=4, blocks=400, max_model_len=64, **kw):
    cfg = EngineConfig(max_model_len=max_model_len, kv_cache_bytes=blocks * block_bytes(model, block_size),
                       block_size=block_size, **kw)
    return PagedEngine(model, cfg)


def assert_pool_empty(e):
    assert e.blocks.num_used == 0 and not any(e.blocks.ref_counts)


def plain_responses_with_a_stop(model, caps, max_new, *, row, index):
    """(stop, expected): the token the plain sampler's greedy response `row` of PROMPTS has at
    `index`, and the plain sampler's greedy responses with it as the stop token, cut at `caps`; at
    least one of them ends on it."""
    free = PlainSampler(model, max_batch_size=16).generate(PROMPTS, greedy(max_new), torch.Generator())
    stop = free[row][index]
    expected = PlainSampler(model, max_batch_size=16).generate(PROMPTS, greedy(max_new, stop=(stop,)),
                                                                torch.Generator())
    expected = [r[:c] for r, c in zip(expected, caps)]
    assert any(len(r) < c and r[-1] == stop for r, c in zip(expected, caps))  # a stop token ends a response
    return stop, expected


def round_work(caps, steps_per_round):
    """(rounds, wasted row steps) when every row decodes from the first step: a row with cap c
    decodes c - 1 steps, and stays in the batch to the end of the round where it stops."""
    total = max(caps) - 1
    rounds = math.ceil(total / steps_per_round)
    occupied = [min(math.ceil((c - 1) / steps_per_round) * steps_per_round, total) for c in caps]
    return rounds, sum(occupied) - sum(c - 1 for c in caps)


@pytest.mark.parametrize("block_size, max_num_seqs, steps_per_round",
                         [(1, 16, 7), (4, 16, 1), (4, 16, 4), (16, 16, 16), (4, 3, 1), (4, 3, 5)])
def test_greedy_equals_plain_sampler_token_for_token(models, block_size, max_num_seqs, steps_per_round):
    """max_num_seqs 3: samples are admitted while others decode, groups split over several prefills."""
    _, ours = models
    params = SamplingParams(max_new_tokens=20, max_length=64, do_sample=False)
    expected = PlainSampler(ours, max_batch_size=16).generate(PROMPTS, params, torch.Generator())
    caps = [20, 7, 20, 20, 3, 20, 11, 20, 20]  # sequences finish at different steps
    expected = [r[:c] for r, c in zip(expected, caps)]
    e = engine(ours, block_size=block_size, blocks=4000 // block_size, max_prefill_batch=2, max_num_seqs=max_num_seqs,
               decode_steps_per_round=steps_per_round)
    assert e.generate(PROMPTS, params, torch.Generator(), max_new_per_prompt=caps) == expected
    stats = e.stats()
    assert stats["generated_tokens"] == sum(caps)
    if max_num_seqs >= len(PROMPTS):  # all decode together: a row with cap c takes part in c - 1 steps
        assert stats["decode_steps"] == max(caps) - 1
        assert stats["mean_live_batch"] == pytest.approx((sum(caps) - len(caps)) / (max(caps) - 1))
        assert (stats["decode_rounds"], stats["wasted_row_steps"]) == round_work(caps, steps_per_round)
    else:
        assert stats["mean_live_batch"] <= max_num_seqs
    assert (stats["wasted_row_steps"] == 0) == (steps_per_round == 1)
    assert_pool_empty(e)


@pytest.mark.parametrize("steps_per_round", [1, 5])
def test_stop_token_is_kept_and_ends_only_its_response(models, steps_per_round):
    """With rounds of 5 steps the stop token comes inside a round: the row's later steps record nothing."""
    _, ours = models
    free = PlainSampler(ours, max_batch_size=4).generate(BASE, greedy(12), torch.Generator())
    idx = next(i for i in range(3, 12) if free[0][i] not in free[0][:i] and i % 5 != 0)
    stop = free[0][idx]
    expected = PlainSampler(ours, max_batch_size=4).generate(BASE, greedy(12, stop=(stop,)), torch.Generator())
    e = engine(ours, decode_steps_per_round=steps_per_round)
    got = e.generate(BASE, greedy(12, stop=(stop,)), torch.Generator())
    assert got == expected and got[0] == free[0][: idx + 1] and got[0][-1] == stop
    assert_pool_empty(e)


def test_max_new_tokens_and_max_length_cap_responses(models):
    _, ours = models
    e = engine(ours)
    assert [len(r) for r in e.generate(BASE, greedy(5), torch.Generator())] == [5, 5, 5, 5]
    # max_length 10: prompt of 9 tokens (one short) gets exactly one token
    assert [len(r) for r in e.generate(BASE, greedy(50, max_length=10), torch.Generator())] == [5, 9, 1, 8]
    assert_pool_empty(e)


def test_first_token_can_end_a_response_at_prefill(models):
    _, ours = models
    first = engine(ours).generate(BASE, greedy(1), torch.Generator())
    stop = first[2][0]
    got = engine(ours).generate(BASE, greedy(8, stop=(stop,)), torch.Generator())
    expected = PlainSampler(ours, max_batch_size=4).generate(BASE, greedy(8, stop=(stop,)), torch.Generator())
    assert got == expected and got[2] == [stop]


@pytest.mark.parametrize("steps_per_round", [1, 4, 16])
@pytest.mark.parametrize("static_shapes", [False, True], ids=["live_rows", "graph_shapes"])
def test_tiny_pool_preempts_and_gives_the_big_pools_tokens(models, static_shapes, steps_per_round):
    """Rows stop at different steps, so with rounds of several steps the pool runs out at round
    boundaries while some rows are in the middle of their responses and others stopped mid-round."""
    _, ours = models
    caps = [30, 9, 30, 30, 5, 30, 17, 30, 30]
    big = engine(ours, blocks=400, decode_steps_per_round=1)
    expected = big.generate(PROMPTS, greedy(30), torch.Generator(), max_new_per_prompt=caps)
    assert big.stats()["preemptions"] == 0
    tiny = engine(ours, blocks=18, decode_steps_per_round=steps_per_round)  # 16 blocks of 4 hold one 64-token sequence
    tiny.runner.static_shapes = static_shapes  # graph shapes: padding rows after preemptions write the null block
    assert tiny.generate(PROMPTS, greedy(30), torch.Generator(), max_new_per_prompt=caps) == expected
    stats = tiny.stats()
    assert stats["preemptions"] > 0 and stats["recomputed_tokens"] > 0
    assert stats["peak_kv_use"] == 1.0
    assert stats["decode_rounds"] < stats["decode_steps"] or steps_per_round == 1
    assert stats["kv_blocks_in_use"] == 0
    assert_pool_empty(tiny)


def test_prefix_sharing_saves_the_full_prompt_blocks_of_every_extra_sample(models):
    _, ours = models
    e = engine(ours, block_size=4)
    e.generate(PROMPTS, greedy(3), torch.Generator())
    # full blocks of 4: prompt 0 (5 tokens) 1 x 2 extra samples, prompt 2 (9 tokens) 2 x 3 extra samples
    assert e.stats()["kv_blocks_saved"] == 1 * 2 + 2 * 3
    prompt_tokens = 3 * 5 + 1 + 4 * 9 + 2
    assert e.stats()["prefix_hit_rate"] == pytest.approx(1 - (5 + 1 + 9 + 2) / prompt_tokens)


def test_per_prompt_limits_and_a_freed_cache_rebuilt(models):
    _, ours = models
    e = engine(ours, keep_cache=False)
    caps = [1, 2, 3, 4, 5, 6, 7, 8, 30]
    got = e.generate(PROMPTS, greedy(10), torch.Generator(), max_new_per_prompt=caps)
    assert [len(r) for r in got] == [min(c, 10) for c in caps]
    assert not e.runner.allocated
    again = e.generate(PROMPTS, greedy(10), torch.Generator())
    assert [r[: len(g)] for r, g in zip(again, got)] == got


def test_sampled_runs_are_reproducible_from_the_seed(models):
    _, ours = models
    params = SamplingParams(max_new_tokens=8, max_length=64, top_k=20, top_p=0.9, temperature=0.8)
    e = engine(ours)
    a = e.generate(PROMPTS, params, torch.Generator().manual_seed(7))
    b = e.generate(PROMPTS, params, torch.Generator().manual_seed(7))
    c = e.generate(PROMPTS, params, torch.Generator().manual_seed(8))
    assert a == b and a != c
    # resume: a fresh engine given the generator's saved state samples what the straight run did next
    g = torch.Generator().manual_seed(7)
    first = e.generate(PROMPTS, params, g)
    state = g.get_state()
    straight = e.generate(PROMPTS, params, g)
    resumed = engine(ours).generate(PROMPTS, params, torch.Generator().set_state(state))
    assert first == a and resumed == straight and straight != first
    # the three samples of prompt 0 are independent draws, not copies of one
    assert len({tuple(r) for r in a[:3]}) > 1


def test_a_round_draws_one_uniform_per_row_and_step_in_one_call(models):
    """The documented stream: the prefill draws rand(4) for the four first tokens, each round of
    4 steps rand(4 steps, 4 rows), [j, r] feeding row r at step j. Each token must be the eager
    sampler's draw, with that uniform, from the fp32 logits of the response so far."""
    _, ours = models
    params = SamplingParams(max_new_tokens=9, max_length=64, top_k=20, top_p=0.9, temperature=0.8)
    e = engine(ours, decode_steps_per_round=4)
    got = e.generate(BASE, params, torch.Generator().manual_seed(5))
    assert e.stats()["decode_rounds"] == 2 and [len(r) for r in got] == [9] * 4
    g = torch.Generator().manual_seed(5)
    first = torch.rand(4, generator=g)
    rounds = torch.cat([torch.rand(4, 4, generator=g), torch.rand(4, 4, generator=g)])  # (8 steps, 4 rows)
    uniform = torch.cat([first[None], rounds])  # (9 tokens, 4 rows)
    for r, (prompt, response) in enumerate(zip(BASE, got)):
        ids = torch.tensor(prompt + response)
        P, T = len(prompt), len(ids)
        with torch.no_grad():
            logits = ours(ids, torch.arange(T), torch.tensor([0, T], dtype=torch.int32), T,
                          head=lambda h, w: F.linear(h[P - 1 : T - 1], w))  # (9, V) fp32
        expected = sample_from_logits_eager(logits, uniform[:, r], temperature=0.8, top_k=20, top_p=0.9)
        assert response == expected.tolist(), f"row {r}"


def test_decode_steps_per_round_must_be_positive(models):
    with pytest.raises(ValueError, match="decode_steps_per_round = 0: must be >= 1"):
        EngineConfig(max_model_len=64, kv_cache_bytes=2**20, decode_steps_per_round=0)


@pytest.mark.parametrize("key", ["gemv_max_tokens", "skinny_max_tokens", "shared_prefix_min_rows"])
def test_row_thresholds_must_not_be_negative(key):
    with pytest.raises(ValueError, match=f"EngineConfig.{key} = -1: must be >= 0"):
        EngineConfig(max_model_len=64, kv_cache_bytes=2**20, **{key: -1})


def test_one_sequence_of_a_long_max_model_len_fits_beside_the_watermark(models):
    """max_num_seqs 1 and 100 blocks a sequence: the pool's cap (what the engine can ever use)
    leaves one whole sequence free beside the watermark, which holds back one block here."""
    _, ours = models
    e = engine(ours, max_model_len=400, blocks=1000, max_num_seqs=1)
    assert e.blocks.capacity == 101 and e.scheduler.watermark_blocks == 1
    smallest, largest = e.pool_bytes_range()
    assert smallest == largest == 101 * e.block_bytes
    params = greedy(6, max_length=400)
    assert e.generate(BASE, params, torch.Generator()) == PlainSampler(ours, max_batch_size=4).generate(
        BASE, params, torch.Generator())


def test_pool_smaller_than_one_sequence_is_refused(models):
    _, ours = models
    with pytest.raises(ValueError, match="less than one sequence of max_model_len = 64"):
        engine(ours, blocks=10)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; bins expected below 5 are pooled into one."""
    n = counts.sum()
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].sum()[None].double()])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("rule", [dict(temperature=0.6), dict(top_k=5, temperature=2.0),
                                  dict(top_p=0.8, temperature=2.0)], ids=["temperature", "top_k", "top_p"])
def test_first_token_frequencies_follow_the_reference_rule(models, rule):
    """4000 samples of one prompt (k independent first tokens from one prefill) against the
    probabilities of reference 4.2; fixed seed, rejected below significance 0.001."""
    _, ours = models
    n = 4000
    params = SamplingParams(max_new_tokens=1, max_length=16, **rule)
    e = engine(ours, max_model_len=16, max_num_seqs=n, blocks=n + 100)
    got = e.generate([BASE[2]] * n, params, torch.Generator().manual_seed(0))
    assert e.stats()["prefix_hit_rate"] == pytest.approx(1 - 1 / n)
    tokens = torch.tensor([r[0] for r in got])
    with torch.no_grad():
        ids = torch.tensor(BASE[2])
        cu = torch.tensor([0, len(ids)], dtype=torch.int32)
        logits = ours(ids, torch.arange(len(ids)), cu, len(ids), head=lambda h, w: F.linear(h[-1:], w))
    probs = filter_logits(logits.float(), params).softmax(-1)[0]
    counts = torch.bincount(tokens, minlength=probs.numel())
    assert counts[probs == 0].sum() == 0  # nothing outside the kept set
    assert (probs > 0).sum() >= 4  # the rule leaves a real choice to test
    assert chi_square_p_value(counts, probs) > 1e-3


def test_decoding_at_graph_shapes_pads_into_the_null_block_and_changes_no_token(models):
    """CUDA's step shapes on CPU: rows padded to the batch bucket, every block-table column read."""
    _, ours = models
    expected = engine(ours).generate(PROMPTS, greedy(20), torch.Generator())
    e = engine(ours, max_num_seqs=16)
    e.runner.static_shapes = True
    assert e.generate(PROMPTS, greedy(20), torch.Generator()) == expected
    assert_pool_empty(e)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the Triton row-state kernels on CPU need TRITON_INTERPRET=1")
@pytest.mark.parametrize("static_shapes", [False, True], ids=["live_rows", "graph_shapes"])
def test_row_state_kernels_change_no_token_and_no_logprob(models, static_shapes):
    """The engine's CUDA path of the row state on CPU (`decode_slots`, `decode_tail`): greedy equals
    the plain sampler token for token, and greedy and sampled runs (the step's uniforms picked by
    `decode_slots`) equal the eager row state's tokens and log-probs bit for bit; rounds of 4 steps,
    rows stopping inside them at their cap or a stop token."""
    _, ours = models
    caps = [12, 4, 12, 12, 1, 12, 7, 12, 12]
    stop, expected = plain_responses_with_a_stop(ours, caps, 12, row=3, index=5)
    settings = {"greedy": greedy(12, stop=(stop,)),
                "sampled": SamplingParams(max_new_tokens=12, max_length=64, top_p=0.9, stop_token_ids=(stop,))}
    runs = {}
    for impl in ("eager", "triton"):
        for name, params in settings.items():
            e = engine(ours, decode_steps_per_round=4, max_num_seqs=16)
            e.runner.static_shapes = static_shapes
            e.runner.row_state_impl = impl
            tokens = e.generate(PROMPTS, params, torch.Generator().manual_seed(3), max_new_per_prompt=caps)
            runs[impl, name] = tokens, e.response_logprobs()
            assert_pool_empty(e)
    assert runs["triton", "greedy"][0] == expected
    assert runs["triton", "sampled"][0] != expected
    for name in settings:
        (tokens, logprobs), (eager_tokens, eager_logprobs) = runs["triton", name], runs["eager", name]
        assert tokens == eager_tokens, name
        assert all(torch.equal(a, b) for a, b in zip(logprobs, eager_logprobs)), name


def test_per_prompt_caps_must_match_the_prompts(models):
    _, ours = models
    e = engine(ours)
    with pytest.raises(ValueError, match="one int >= 1 per prompt"):
        e.generate(BASE, greedy(5), torch.Generator(), max_new_per_prompt=[3, 3])
    with pytest.raises(ValueError, match="one int >= 1 per prompt"):
        e.generate(BASE, greedy(5), torch.Generator(), max_new_per_prompt=[3, 0, 3, 3])
    assert_pool_empty(e)


def test_programmatic_dependent_launch_off_hopper_is_refused_at_build(models):
    with pytest.raises(ValueError, match="gemv_pdl: pdl=True needs a CUDA device of compute capability >= 9"):
        engine(models[1], gemv_max_tokens=1, gemv_pdl=True)


def test_blocks_held_after_a_call_show_in_its_stats(models):
    """kv_blocks_in_use counts what the pool still holds when the call returns: 0 after a normal
    call; with one sequence's release dropped (a leak), its blocks."""
    e = engine(models[1])
    e.generate(PROMPTS, greedy(5), torch.Generator())
    assert e.stats()["kv_blocks_in_use"] == 0
    release, dropped = e.blocks.release, []

    def leaky_release(table):
        if dropped:
            return release(table)
        dropped.append(list(table))

    e.blocks.release = leaky_release
    e.generate(PROMPTS, greedy(5), torch.Generator())
    assert len(dropped[0]) > 0 and e.stats()["kv_blocks_in_use"] == e.blocks.num_used >= len(dropped[0])


def spy_rounds(e):
    """Log ("launch", i) as round i is launched and ("read", i) as the host reads it."""
    log, end_round = [], e.runner.end_round

    def logged_end_round(steps):
        state, i = end_round(steps), sum(kind == "launch" for kind, _ in log)
        log.append(("launch", i))
        read = state.read

        def logged_read():
            log.append(("read", i))
            return read()

        state.read = logged_read
        return state

    e.runner.end_round = logged_end_round
    return log


@pytest.mark.parametrize("overlap", [True, False])
def test_the_next_round_is_launched_before_the_last_is_read(models, overlap):
    """Overlapped rounds: the host launches round i + 1, then reads round i (so the device never
    waits for the host between rounds); without overlap it reads each round before the next."""
    _, ours = models
    e = engine(ours, decode_steps_per_round=3, overlap_rounds=overlap)
    log = spy_rounds(e)
    assert e.generate(BASE, greedy(12), torch.Generator()) == engine(ours, overlap_rounds=not overlap).generate(
        BASE, greedy(12), torch.Generator())
    rounds = e.stats()["decode_rounds"]
    assert rounds == 4  # 11 decode steps in rounds of 3
    if overlap:
        expected = [("launch", 0)] + [x for i in range(1, rounds) for x in (("launch", i), ("read", i - 1))]
        assert log == expected + [("read", rounds - 1)]
    else:
        assert log == [x for i in range(rounds) for x in (("launch", i), ("read", i))]


@pytest.mark.parametrize("steps_per_round", [1, 3, 8])
@pytest.mark.parametrize("static_shapes", [False, True], ids=["live_rows", "graph_shapes"])
def test_overlapped_rounds_give_the_plain_samplers_tokens_through_stops_admissions_and_preemption(
        models, static_shapes, steps_per_round):
    """Rows stop on a stop token (learnt one round late) or at their cap (known ahead), wait for
    rows (max_num_seqs 3) and for blocks (a pool of one max-length sequence: preemption, which waits
    for the unread round): every response is the plain sampler's, every block returns."""
    _, ours = models
    caps = [30, 9, 30, 30, 5, 30, 17, 30, 30]
    stop, expected = plain_responses_with_a_stop(ours, caps, 30, row=0, index=6)
    for blocks, max_num_seqs in ((400, 3), (18, 16)):
        e = engine(ours, blocks=blocks, max_num_seqs=max_num_seqs, decode_steps_per_round=steps_per_round)
        e.runner.static_shapes = static_shapes
        plans, prepare_round = [], e.scheduler.prepare_round

        def logged_prepare_round(max_steps, ahead=0, prepare_round=prepare_round):
            plans.append((ahead, prepare_round(max_steps, ahead)))
            return plans[-1][1]

        e.scheduler.prepare_round = logged_prepare_round
        assert e.generate(PROMPTS, greedy(30, stop=(stop,)), torch.Generator(), max_new_per_prompt=caps) == expected
        assert any(ahead for ahead, _ in plans)  # rounds were planned ahead of an unread one
        if blocks == 18:
            assert e.stats()["preemptions"] > 0
            assert any(ahead and plan is None for ahead, plan in plans)  # a plan that waited for the read
        assert_pool_empty(e)


@pytest.mark.parametrize("steps_per_round", [1, 8])
@pytest.mark.parametrize("static_shapes", [False, True], ids=["live_rows", "graph_shapes"])
def test_shared_prefix_groups_follow_the_rows_through_stops_admissions_and_preemption(
        models, static_shapes, steps_per_round):
    """With `shared_prefix_min_rows` each round names the groups of rows sharing a prompt's blocks;
    the eager attention checks every step's groups against the block tables on the device (the
    same rows, prefix lengths and table entries: `SharedPrefix`), and the tokens stay the plain
    sampler's through rows stopping inside rounds, rows waiting for rows and for blocks, and
    preemption."""
    _, ours = models
    caps = [30, 9, 30, 30, 5, 30, 17, 30, 30]
    expected = engine(ours).generate(PROMPTS, greedy(30), torch.Generator(), max_new_per_prompt=caps)
    for blocks, max_num_seqs in ((400, 3), (400, 16), (18, 16)):
        e = engine(ours, blocks=blocks, max_num_seqs=max_num_seqs, decode_steps_per_round=steps_per_round,
                   shared_prefix_min_rows=2)
        e.runner.static_shapes = static_shapes
        groups, set_shared_prefix = [], e.runner.set_shared_prefix

        def logged(prefix_lens, group_rows, set_shared_prefix=set_shared_prefix):
            groups.append([(int(n), int(p)) for n, p in zip(group_rows, prefix_lens) if n])
            set_shared_prefix(prefix_lens, group_rows)

        e.runner.set_shared_prefix = logged
        assert e.generate(PROMPTS, greedy(30), torch.Generator(), max_new_per_prompt=caps) == expected
        # (rows, prefix tokens): prompt 0 (5 tokens) shares 1 block of 4, prompt 2 (9 tokens) 2 blocks
        seen = {g for round_groups in groups for g in round_groups}
        assert (3, 4) in seen and all(p in (4, 8) for _, p in seen)
        assert any(p == 8 for _, p in seen)  # prompt 2's samples, all 4 or those left after stops
        if blocks == 18:
            assert e.stats()["preemptions"] > 0
        assert_pool_empty(e)


@pytest.mark.parametrize("min_rows", [0, 4])
def test_only_steps_of_shared_prefix_min_rows_rows_or_more_take_the_groups(models, monkeypatch, min_rows):
    _, ours = models
    calls = []

    def attention(q, *args, shared=None, **kw):
        calls.append((q.shape[0], shared is not None))
        return paged_decode_attention(q, *args, shared=shared, **kw)

    monkeypatch.setattr(model_runner, "paged_decode_attention", attention)
    e = engine(ours, shared_prefix_min_rows=min_rows, decode_steps_per_round=1)
    e.generate(PROMPTS, greedy(12), torch.Generator(), max_new_per_prompt=[12, 3, 2, 9, 2, 3, 5, 12, 4])
    rows = {b for b, _ in calls}
    assert min(rows) < 4 <= max(rows)  # live batches below and above the threshold
    assert all(with_groups == (0 < min_rows <= b) for b, with_groups in calls)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_row_stopped_in_an_unread_round_still_draws_in_the_next(models, overlap):
    """The documented stream with a stop token: row 1 stops inside the first round of 4 steps. Read
    before the next round (no overlap), that round draws rand(4 steps, 3 rows) for rows 0, 2, 3;
    overlapped, it is planned before the read and draws rand(4, 4), row 1 included. Each token must
    be the eager sampler's draw from that stream."""
    _, ours = models
    params = SamplingParams(max_new_tokens=9, max_length=64, top_k=20, top_p=0.9, temperature=0.8)
    for seed in range(20):  # a seed whose row 1 samples, inside round 1, a token no row sampled before
        free = engine(ours, decode_steps_per_round=4).generate(BASE, params, torch.Generator().manual_seed(seed))
        stop = free[1][2]
        if stop not in free[1][:2] and all(stop not in r[:5] for i, r in enumerate(free) if i != 1):
            break
    else:
        pytest.fail("no seed in 0..19 gives a usable stop token")
    stopping = dataclasses.replace(params, stop_token_ids=(stop,))
    e = engine(ours, decode_steps_per_round=4, overlap_rounds=overlap)
    got = e.generate(BASE, stopping, torch.Generator().manual_seed(seed))
    assert got[1] == free[1][:3] and e.stats()["decode_rounds"] == 2
    g = torch.Generator().manual_seed(seed)
    first, round1 = torch.rand(1, 4, generator=g), torch.rand(4, 4, generator=g)
    rows2 = [0, 1, 2, 3] if overlap else [0, 2, 3]
    round2 = torch.zeros(4, 4)
    round2[:, rows2] = torch.rand(4, len(rows2), generator=g)
    uniform = torch.cat([first, round1, round2])  # (9 tokens, 4 rows)
    for r, (prompt, response) in enumerate(zip(BASE, got)):
        ids = torch.tensor(prompt + response)
        P, T = len(prompt), len(ids)
        with torch.no_grad():
            logits = ours(ids, torch.arange(T), torch.tensor([0, T], dtype=torch.int32), T,
                          head=lambda h, w: F.linear(h[P - 1 : T - 1], w))
        expected = sample_from_logits_eager(logits, uniform[: T - P, r], temperature=0.8, top_k=20, top_p=0.9)
        assert response == expected.tolist(), f"row {r}"


def test_the_calls_time_is_split_by_prefill_and_the_rounds_batch(models):
    """stats() charges each interval between host syncs to what the sync waited for: the prefill
    chunks, or decode rounds by their rows (at most 9 here; one prompt alone decodes at batch 1)."""
    _, ours = models
    e = engine(ours, decode_steps_per_round=3)
    e.generate(PROMPTS, greedy(12), torch.Generator(), max_new_per_prompt=[12, 4, 12, 12, 1, 12, 7, 12, 12])
    s = e.stats()
    buckets = ["1", "2_16", "17_128", "129_512", "513_up"]
    assert s["prefill_s"] > 0 and s["decode_s_batch_2_16"] > 0
    assert s["decode_s_batch_17_128"] == s["decode_s_batch_129_512"] == s["decode_s_batch_513_up"] == 0
    assert s["prefill_s"] + sum(s[f"decode_s_batch_{b}"] for b in buckets) <= s["time_s"]
    e.generate(BASE[:1], greedy(12), torch.Generator())
    s = e.stats()
    assert s["decode_s_batch_1"] > 0 and all(s[f"decode_s_batch_{b}"] == 0 for b in buckets[1:])
