"""decode_slots and decode_tail: the Triton kernels and their eager twins against a row-by-row
Python reference of the engine's decode-step arithmetic, on fresh random row states (a whole engine
with them: tests/rollout/test_engine.py).

Every buffer is a slice [:B] of a wider one, as the engine passes its row state: the entries past B,
the round buffers' other rows, and the fields of rows that must not move are checked unchanged.
Integer arithmetic and copies only: every comparison is exact.
CPU: under TRITON_INTERPRET=1 a block is 16 rows, so B = 37 ends on a ragged block and 300 crosses
many; on a GPU one block holds 256 rows.
"""

import pytest
import torch

from oreal_fast.kernels import decode_slots, decode_slots_eager, decode_tail, decode_tail_eager

BATCHES = [1, 5, 16, 37, 300]
IMPLS = ["triton", "eager"]
VOCAB, STEPS = 50, 6


def _padded(B: int) -> int:
    """Rows of the engine's buffers around a batch of B: a few more, which no call may touch."""
    return B + 3


def _num_live(B: int) -> int:
    """Live rows of a batch of B; the rest are padding rows (zero and done), as in a CUDA graph's bucket."""
    return max(1, B - B // 4)


# ---------------------------------------------------------------------------------- decode_slots

def _slots_state(B: int, block_size: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    R, n, width = _padded(B), _num_live(B), 5
    positions = torch.randint(0, width * block_size, (R,), generator=g)
    tables = torch.randint(1, 1000, (R, width + 2), generator=g, dtype=torch.int32)
    done = torch.rand(R, generator=g) < 0.3
    positions[n:], tables[n:], done[n:] = 0, 0, True  # padding rows
    return {
        "positions": positions, "block_tables": tables, "done": done,
        "step": torch.randint(0, STEPS, (1,), generator=g),
        "uniform": torch.rand(STEPS, R, generator=g),
        # outputs: stale values everywhere, so that an entry left unwritten shows
        "slots": torch.randint(-9, 0, (R,), generator=g),
        "context_lens": torch.randint(-9, 0, (R,), generator=g, dtype=torch.int32),
        "step_uniform": -torch.rand(R, generator=g),
    }


def _run_slots(fn, state: dict[str, torch.Tensor], B: int, block_size: int, device: str, **kw) -> dict:
    s = {k: v.clone().to(device) for k, v in state.items()}
    width = state["block_tables"].shape[1] - 2  # the block-table columns a step reads
    fn(s["positions"][:B], s["block_tables"][:B, :width], s["done"][:B], block_size, s["step"],
       s["uniform"][:, :B], s["slots"][:B], s["context_lens"][:B], s["step_uniform"][:B], **kw)
    return {k: v.cpu() for k, v in s.items()}


def _slots_reference(state: dict[str, torch.Tensor], B: int, block_size: int) -> dict:
    """Row by row on Python ints: slot = table[pos // block_size] * block_size + pos % block_size, 0
    where done; context = pos + 1; the uniform of row `step`."""
    out = {k: v.clone() for k, v in state.items()}
    step = int(state["step"])
    for i in range(B):
        pos = int(state["positions"][i])
        block = int(state["block_tables"][i, pos // block_size])
        out["slots"][i] = 0 if state["done"][i] else block * block_size + pos % block_size
        out["context_lens"][i] = pos + 1
        out["step_uniform"][i] = state["uniform"][step, i]
    return out


def _assert_equal_buffers(got: dict, expected: dict) -> None:
    for name, ref in expected.items():
        assert got[name].dtype == ref.dtype, name
        assert torch.equal(got[name], ref), name


@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_decode_slots_matches_the_reference_and_its_twin(device, B, block_size):
    state = _slots_state(B, block_size, seed=B * 100 + block_size)
    expected = _slots_reference(state, B, block_size)
    if B > 1:  # rows of both kinds: a done row's slot is 0, whatever its table says
        assert expected["done"][:B].any() and (~expected["done"][:B]).any()
    got = _run_slots(decode_slots, state, B, block_size, device)
    _assert_equal_buffers(got, expected)
    _assert_equal_buffers(_run_slots(decode_slots_eager, state, B, block_size, "cpu"), expected)
    for name in ("slots", "context_lens", "step_uniform"):  # past B: untouched
        assert torch.equal(got[name][B:], state[name][B:]), name


# ---------------------------------------------------------------------------------- decode_tail

def _tail_state(B: int, num_stops: int, seed: int) -> dict[str, torch.Tensor]:
    """A row state mid-round: some rows done before, some one token short of their limit, some about
    to sample a stop token; padding rows zero and done."""
    g = torch.Generator().manual_seed(seed)
    R, n = _padded(B), _num_live(B)
    stop_ids = torch.randperm(VOCAB, generator=g)[:num_stops]
    tokens = torch.randint(0, VOCAB, (R,), generator=g)
    if num_stops:
        at_stop = torch.rand(R, generator=g) < 0.25
        tokens[at_stop] = stop_ids[torch.randint(0, num_stops, (R,), generator=g)][at_stop]
    limits = torch.randint(2, 20, (R,), generator=g)
    num_new = (limits - torch.randint(1, 5, (R,), generator=g)).clamp_min(1)  # 1 short: this token ends the row
    done = torch.rand(R, generator=g) < 0.25
    positions = torch.randint(5, 60, (R,), generator=g)
    input_ids = torch.randint(0, VOCAB, (R,), generator=g)
    for t in (limits, num_new, positions, input_ids):
        t[n:] = 0
    done[n:] = True
    return {
        "tokens": tokens, "logprobs": -5 * torch.rand(R, generator=g), "stop_ids": stop_ids, "limits": limits,
        "step": torch.randint(0, STEPS, (1,), generator=g),
        "round_tokens": torch.randint(0, VOCAB, (STEPS, R), generator=g),
        "round_logprobs": -torch.rand(STEPS, R, generator=g),
        "num_new": num_new, "done": done, "positions": positions, "input_ids": input_ids,
    }


def _tail_args(s: dict[str, torch.Tensor], B: int) -> list[torch.Tensor]:
    return [s["tokens"][:B], s["logprobs"][:B], s["stop_ids"], s["limits"][:B], s["step"], s["round_tokens"][:, :B],
            s["round_logprobs"][:, :B], s["num_new"][:B], s["done"][:B], s["positions"][:B], s["input_ids"][:B]]


def _run_tail(fn, state: dict[str, torch.Tensor], B: int, device: str, **kw) -> dict:
    s = {k: v.clone().to(device) for k, v in state.items()}
    fn(*_tail_args(s, B), **kw)
    return {k: v.cpu() for k, v in s.items()}


def _tail_reference(state: dict[str, torch.Tensor], B: int) -> dict:
    """Row by row on Python values: record every row's token at row `step` of the round buffers; a
    row not done counts it, then stops at its limit or a stop token, else moves on to it."""
    out = {k: v.clone() for k, v in state.items()}
    step, stops = int(state["step"]), set(state["stop_ids"].tolist())
    for i in range(B):
        token = int(state["tokens"][i])
        out["round_tokens"][step, i] = token
        out["round_logprobs"][step, i] = state["logprobs"][i]
        if state["done"][i]:
            continue
        out["num_new"][i] += 1
        if int(out["num_new"][i]) >= int(state["limits"][i]) or token in stops:
            out["done"][i] = True
        else:
            out["positions"][i] += 1
            out["input_ids"][i] = token
    out["step"][0] = step + 1
    return out


@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("num_stops", [0, 1, 3])
def test_decode_tail_matches_the_reference_and_its_twin(device, B, num_stops):
    state = _tail_state(B, num_stops, seed=B * 10 + num_stops)
    expected = _tail_reference(state, B)
    if B >= 37:  # every kind of row is there: done before, stopped by its limit, by a stop token, going on
        was_done, now_done = state["done"][:B], expected["done"][:B]
        at_limit = expected["num_new"][:B] >= state["limits"][:B]
        at_stop = torch.isin(state["tokens"][:B], state["stop_ids"])
        assert was_done.any() and (now_done & ~was_done & at_limit).any() and (~now_done).any()
        assert (now_done & ~was_done & ~at_limit & at_stop).any() == (num_stops > 0)
    got = _run_tail(decode_tail, state, B, device)
    _assert_equal_buffers(got, expected)
    _assert_equal_buffers(_run_tail(decode_tail_eager, state, B, "cpu"), expected)
    # what must not move, checked directly: other round rows, entries past B, the fields of rows done before
    step = int(state["step"])
    others = [r for r in range(STEPS) if r != step]
    assert torch.equal(got["round_tokens"][others], state["round_tokens"][others])
    assert torch.equal(got["round_logprobs"][others], state["round_logprobs"][others])
    for name in ("round_tokens", "round_logprobs"):
        assert torch.equal(got[name][:, B:], state[name][:, B:]), name
    for name in ("num_new", "done", "positions", "input_ids", "tokens", "limits"):
        assert torch.equal(got[name][B:], state[name][B:]), name
    was_done = state["done"][:B]
    for name in ("num_new", "positions", "input_ids"):
        assert torch.equal(got[name][:B][was_done], state[name][:B][was_done]), name


@pytest.mark.parametrize("B", [1, 37])
def test_a_round_of_decode_tails_equals_its_twin(device, B):
    """Several steps in a row on one row state: each step writes the next round row and moves `step` on."""
    state = _tail_state(B, 2, seed=B)
    state["step"].zero_()
    triton_state = {k: v.clone().to(device) for k, v in state.items()}
    eager_state = {k: v.clone() for k, v in state.items()}
    g = torch.Generator().manual_seed(B + 1)
    for _ in range(STEPS):
        tokens, logprobs = torch.randint(0, VOCAB, (B,), generator=g), -torch.rand(B, generator=g)
        for s, fn, dev in ((triton_state, decode_tail, device), (eager_state, decode_tail_eager, "cpu")):
            s["tokens"][:B], s["logprobs"][:B] = tokens.to(dev), logprobs.to(dev)
            fn(*_tail_args(s, B))
    assert int(triton_state["step"]) == STEPS
    _assert_equal_buffers({k: v.cpu() for k, v in triton_state.items()}, eager_state)


# ---------------------------------------------------------------------------------- input checks

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("change, message", [
    (dict(positions=lambda t: t.int()), r"positions must be \[B=4\] torch.int64"),
    (dict(positions=lambda t: t.repeat(2)[::2]), r"positions must be \[B=4\] torch.int64 with unit stride"),
    (dict(done=lambda t: t[:3]), r"done must be \[B=4\] torch.bool"),
    (dict(block_tables=lambda t: t.long()), r"block_tables must be \[B=4, W >= 1\] int32"),
    (dict(block_tables=lambda t: t.t().contiguous().t()), r"block_tables must be .* contiguous last dim"),
    (dict(block_size=lambda b: 0), r"block_size must be an int >= 1"),
    (dict(step=lambda t: t.repeat(2)), r"step must be a \[1\] int64 tensor"),
    (dict(uniform=lambda t: t.double()), r"uniform must be \[N >= 1, B=4\] torch.float32"),
    (dict(uniform=lambda t: t[:0]), r"uniform must be \[N >= 1, B=4\]"),
    (dict(slots=lambda t: t.int()), r"slots must be \[B=4\] torch.int64"),
    (dict(context_lens=lambda t: t.long()), r"context_lens must be \[B=4\] torch.int32"),
    (dict(step_uniform=lambda t: t.to("meta")), r"all tensors must be on one device; got .*step_uniform meta"),
])
def test_decode_slots_rejects_bad_inputs(impl, change, message):
    B = 4
    args = dict(positions=torch.zeros(B, dtype=torch.int64), block_tables=torch.zeros(B, 3, dtype=torch.int32),
                done=torch.zeros(B, dtype=torch.bool), block_size=4, step=torch.zeros(1, dtype=torch.int64),
                uniform=torch.zeros(2, B), slots=torch.zeros(B, dtype=torch.int64),
                context_lens=torch.zeros(B, dtype=torch.int32), step_uniform=torch.zeros(B))
    (arg, edit), = change.items()
    args[arg] = edit(args[arg])
    with pytest.raises(ValueError, match=f"decode_slots: {message}"):
        decode_slots(**args, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("change, message", [
    (dict(tokens=lambda t: t.int()), r"tokens must be \[B=4\] torch.int64"),
    (dict(logprobs=lambda t: t[:2]), r"logprobs must be \[B=4\] torch.float32"),
    (dict(stop_ids=lambda t: t[None]), r"stop_ids must be \[S\] int64"),
    (dict(stop_ids=lambda t: t.int()), r"stop_ids must be \[S\] int64"),
    (dict(limits=lambda t: t.float()), r"limits must be \[B=4\] torch.int64"),
    (dict(step=lambda t: t.int()), r"step must be a \[1\] int64 tensor"),
    (dict(round_tokens=lambda t: t[:, :3]), r"round_tokens must be \[N >= 1, B=4\] torch.int64"),
    (dict(round_logprobs=lambda t: t.t().contiguous().t()), r"round_logprobs must be .* contiguous last dim"),
    (dict(round_logprobs=lambda t: t[:1]), r"round_tokens and round_logprobs must have one number of rows"),
    (dict(num_new=lambda t: t.int()), r"num_new must be \[B=4\] torch.int64"),
    (dict(done=lambda t: t.long()), r"done must be \[B=4\] torch.bool"),
    (dict(positions=lambda t: t[:1]), r"positions must be \[B=4\] torch.int64"),
    (dict(input_ids=lambda t: t.repeat(2)[::2]), r"input_ids must be \[B=4\] torch.int64 with unit stride"),
    (dict(limits=lambda t: t.to("meta")), r"all tensors must be on one device; got .*limits meta"),
])
def test_decode_tail_rejects_bad_inputs(impl, change, message):
    B = 4
    args = dict(tokens=torch.zeros(B, dtype=torch.int64), logprobs=torch.zeros(B),
                stop_ids=torch.zeros(2, dtype=torch.int64), limits=torch.zeros(B, dtype=torch.int64),
                step=torch.zeros(1, dtype=torch.int64), round_tokens=torch.zeros(3, B, dtype=torch.int64),
                round_logprobs=torch.zeros(3, B), num_new=torch.zeros(B, dtype=torch.int64),
                done=torch.zeros(B, dtype=torch.bool), positions=torch.zeros(B, dtype=torch.int64),
                input_ids=torch.zeros(B, dtype=torch.int64))
    (arg, edit), = change.items()
    args[arg] = edit(args[arg])
    with pytest.raises(ValueError, match=f"decode_tail: {message}"):
        decode_tail(**args, impl=impl)


def test_impl_is_checked():
    with pytest.raises(ValueError, match="decode_tail: impl must be one of"):
        decode_tail(*[None] * 11, impl="cuda")
    with pytest.raises(ValueError, match="decode_slots_eager: impl must be 'eager'"):
        decode_slots_eager(*[None] * 9, impl="triton")
