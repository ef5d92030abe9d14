"""The rollout engine's row-state arithmetic around a decode step's forward, one Triton kernel on
each side: `decode_slots` before it (each row's pool slot and context length, and the step's
uniform draws), `decode_tail` after the sampler (record the tokens, count them, apply the stop
rule, advance the rows and the step).

Eager, this is 26 torch ops a step, 27 when sampling (the slot arithmetic: floor divide, gather,
cast, multiply, remainder, add, masked fill, add, cast; the tail: an index select of the
uniforms, two index copies into the round buffers, not, add, compare, isin, two ors, not, add,
where, add and the copies back into the row state), each on vectors of at most a few hundred
entries and each a kernel of its own inside the CUDA graph (on an H200 such kernels ran 0.7-1.8 us
each, with the graph's gap between kernels on top: benchmarks/RESULTS.md, the decode-step profile of
2026-12-07). Here each side is one pass over the rows.

The math, as the eager twins compute it, on rows 0..B-1 of the engine's row state
(`oreal_fast.rollout.engine.model_runner`'s module docstring):

    decode_slots(positions, block_tables, done, block_size, step, uniform,
                 slots, context_lens, step_uniform):
        block = block_tables.gather(1, (positions // block_size)[:, None])[:, 0]
        slots[:] = (block.long() * block_size + positions % block_size).masked_fill(done, 0)
        context_lens[:] = (positions + 1).int()
        step_uniform[:] = uniform[step[0]]               # the step's draws, one per row
    decode_tail(tokens, logprobs, stop_ids, limits, step,
                round_tokens, round_logprobs, num_new, done, positions, input_ids):
        round_tokens[step[0]] = tokens                   # every row's, done or not
        round_logprobs[step[0]] = logprobs
        num_new += ~done                                 # a done row stopped earlier: no new token
        done |= (num_new >= limits) | isin(tokens, stop_ids)   # the stop rule (`rollout.base.finished`)
        positions += ~done                               # a row that goes on: its token is the pending one
        input_ids[:] = where(~done, tokens, input_ids)
        step += 1

A done row's slot is slot 0 of the null block, which nothing reads; a stopped row keeps its
position and num_new. Integer arithmetic and copies only: the kernels equal the twins bit for bit.

Who moves `step`: `decode_tail` reads it (the round-buffer row it writes) and increments it. The
programs of one grid run in no fixed order, so in a grid of several programs one that incremented
`step` could run before another read it. `decode_tail` is therefore one program that walks the
rows in blocks: it reads `step` once, writes every row, waits at a barrier until every thread of
the program is past that read, then writes `step + 1`. One program suffices: B is the decode
batch (a few hundred rows at most: one or two blocks of 256 on CUDA), each row a few loads and
stores. `decode_slots` only reads `step`: one program per block of rows. It, not `decode_tail`,
picks the step's uniform draws (before the sampler of the same step reads them): a tail that
picked the next step's would read past the round's rows after its last step.

Budget: decode_slots reads per row its position, done flag, one block-table entry and one uniform
and writes its slot, context length and uniform; decode_tail reads per row its token, log-prob,
num_new, limit, done flag, position and pending token, and the S stop ids, and writes both round
buffers and the four row-state entries. No workspace and no host sync; every output is written in
place into the caller's buffers, so a CUDA graph captures both kernels.

Limits: nothing in range is checked on the device (a check is a device-side assert, i.e. extra
kernels on the decode hot path): the caller guarantees positions >= 0 with
positions // block_size inside block_tables' columns, and 0 <= step < the rows of `uniform` and
of the round buffers, which the twins' indexing enforces. On CPU the Triton path runs only under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oreal_fast.kernels.common import check_eager_impl, check_impl, tiles_for


@triton.jit
def _decode_slots_kernel(Pos_ptr, Table_ptr, Done_ptr, Step_ptr, Uniform_ptr, Slot_ptr, Context_ptr,
                         StepUniform_ptr, B, stride_table, stride_uniform,
                         BLOCK_SIZE: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    mask = rows < B
    pos = tl.load(Pos_ptr + rows, mask=mask, other=0)
    done = tl.load(Done_ptr + rows, mask=mask, other=1)
    # positions are >= 0, where the kernel's truncating // and % equal torch's flooring ones
    block = tl.load(Table_ptr + rows * stride_table + pos // BLOCK_SIZE, mask=mask, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    tl.store(Slot_ptr + rows, tl.where(done, 0, slot), mask=mask)
    tl.store(Context_ptr + rows, (pos + 1).to(tl.int32), mask=mask)
    step = tl.load(Step_ptr)
    tl.store(StepUniform_ptr + rows, tl.load(Uniform_ptr + step * stride_uniform + rows, mask=mask), mask=mask)


@triton.jit
def _decode_tail_kernel(Tok_ptr, Logprob_ptr, Stop_ptr, Limit_ptr, Step_ptr, RoundTok_ptr, RoundLogprob_ptr,
                        NumNew_ptr, Done_ptr, Pos_ptr, InputIds_ptr, B, S, stride_round_tok, stride_round_logprob,
                        BLOCK_ROWS: tl.constexpr):
    step = tl.load(Step_ptr)
    round_tok = RoundTok_ptr + step * stride_round_tok
    round_logprob = RoundLogprob_ptr + step * stride_round_logprob
    for start in range(0, B, BLOCK_ROWS):
        rows = start + tl.arange(0, BLOCK_ROWS)
        mask = rows < B
        tokens = tl.load(Tok_ptr + rows, mask=mask, other=0)
        tl.store(round_tok + rows, tokens, mask=mask)
        tl.store(round_logprob + rows, tl.load(Logprob_ptr + rows, mask=mask, other=0.0), mask=mask)
        was_done = tl.load(Done_ptr + rows, mask=mask, other=1)
        num_new = tl.load(NumNew_ptr + rows, mask=mask, other=0) + (~was_done).to(tl.int64)
        done = was_done | (num_new >= tl.load(Limit_ptr + rows, mask=mask, other=0))
        for s in range(S):
            done = done | (tokens == tl.load(Stop_ptr + s))
        going = ~done
        tl.store(NumNew_ptr + rows, num_new, mask=mask)
        tl.store(Done_ptr + rows, done, mask=mask)
        tl.store(Pos_ptr + rows, tl.load(Pos_ptr + rows, mask=mask, other=0) + going.to(tl.int64), mask=mask)
        pending = tl.load(InputIds_ptr + rows, mask=mask, other=0)
        tl.store(InputIds_ptr + rows, tl.where(going, tokens, pending), mask=mask)
    # every thread has read `step` above (the round buffers' row): only now may it move on
    tl.debug_barrier()
    tl.store(Step_ptr, step + 1)


def _block_rows(device: torch.device) -> int:
    """Rows per block: the CUDA batch buckets up to 256 in one; small under the interpreter, so that
    tests of a few dozen rows cross several blocks."""
    return tiles_for(device, 256, 16)


def _check_vector(name: str, arg: str, t: torch.Tensor, B: int, dtype: torch.dtype) -> None:
    """`t` is [B] of `dtype` with a unit stride (a row-state slice [:B])."""
    if t.shape != (B,) or t.dtype != dtype or (B > 1 and t.stride(0) != 1):
        raise ValueError(f"{name}: {arg} must be [B={B}] {dtype} with unit stride; got {tuple(t.shape)} {t.dtype} "
                         f"strides {t.stride()}")


def _check_rows(name: str, arg: str, t: torch.Tensor, B: int, dtype: torch.dtype) -> None:
    """`t` is [N >= 1, B] of `dtype` with a contiguous last dim (rows may be strided: a slice [:, :B])."""
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] != B or t.dtype != dtype or (B > 1 and t.stride(1) != 1):
        raise ValueError(f"{name}: {arg} must be [N >= 1, B={B}] {dtype} with a contiguous last dim; got "
                         f"{tuple(t.shape)} {t.dtype} strides {t.stride()}")


def _check_step(name: str, step: torch.Tensor) -> None:
    if step.shape != (1,) or step.dtype != torch.int64:
        raise ValueError(f"{name}: step must be a [1] int64 tensor; got {tuple(step.shape)} {step.dtype}")


def _check_one_device(name: str, tensors: dict[str, torch.Tensor]) -> None:
    devices = {str(t.device) for t in tensors.values()}
    if len(devices) > 1:
        found = ", ".join(f"{arg} {t.device}" for arg, t in tensors.items())
        raise ValueError(f"{name}: all tensors must be on one device; got {found}")


def _check_slots(positions: torch.Tensor, block_tables: torch.Tensor, done: torch.Tensor, block_size: int,
                 step: torch.Tensor, uniform: torch.Tensor, slots: torch.Tensor, context_lens: torch.Tensor,
                 step_uniform: torch.Tensor) -> None:
    name = "decode_slots"
    B = positions.shape[0] if positions.dim() == 1 else -1
    _check_vector(name, "positions", positions, B, torch.int64)
    if (block_tables.dim() != 2 or block_tables.shape[0] != B or block_tables.shape[1] < 1
            or block_tables.dtype != torch.int32 or (block_tables.shape[1] > 1 and block_tables.stride(1) != 1)):
        raise ValueError(f"{name}: block_tables must be [B={B}, W >= 1] int32 with a contiguous last dim; got "
                         f"{tuple(block_tables.shape)} {block_tables.dtype} strides {block_tables.stride()}")
    _check_vector(name, "done", done, B, torch.bool)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"{name}: block_size must be an int >= 1; got {block_size!r}")
    _check_step(name, step)
    _check_rows(name, "uniform", uniform, B, torch.float32)
    _check_vector(name, "slots", slots, B, torch.int64)
    _check_vector(name, "context_lens", context_lens, B, torch.int32)
    _check_vector(name, "step_uniform", step_uniform, B, torch.float32)
    _check_one_device(name, dict(positions=positions, block_tables=block_tables, done=done, step=step,
                                 uniform=uniform, slots=slots, context_lens=context_lens, step_uniform=step_uniform))


def decode_slots_eager(positions: torch.Tensor, block_tables: torch.Tensor, done: torch.Tensor, block_size: int,
                       step: torch.Tensor, uniform: torch.Tensor, slots: torch.Tensor, context_lens: torch.Tensor,
                       step_uniform: torch.Tensor, *, impl: str = "eager") -> None:
    """The eager twin (same arguments and writes as `decode_slots`): the engine's torch ops."""
    check_eager_impl("decode_slots_eager", impl)
    _check_slots(positions, block_tables, done, block_size, step, uniform, slots, context_lens, step_uniform)
    block = block_tables.gather(1, (positions // block_size)[:, None])[:, 0]
    slots.copy_((block.to(torch.int64) * block_size + positions % block_size).masked_fill(done, 0))
    context_lens.copy_((positions + 1).to(torch.int32))
    step_uniform.copy_(uniform.index_select(0, step)[0])


def decode_slots(positions: torch.Tensor, block_tables: torch.Tensor, done: torch.Tensor, block_size: int,
                 step: torch.Tensor, uniform: torch.Tensor, slots: torch.Tensor, context_lens: torch.Tensor,
                 step_uniform: torch.Tensor, *, impl: str = "triton") -> None:
    """A decode step's per-row inputs: each row's pool slot and context length, and its uniform draw.

    Args (B rows; the [B] tensors with unit stride, the 2-D ones with a contiguous last dim):
        positions: [B] int64, each row's pending token's position, >= 0.
        block_tables: [B, W] int32, each row's blocks; positions // block_size < W.
        done: [B] bool, rows that write nothing anyone reads (their slot: 0, the null block's first).
        block_size: token slots per block.
        step: [1] int64, the round's step: the row of `uniform` to take.
        uniform: [steps, B] fp32, the round's draws; step < steps.
        slots: [B] int64, written: block_tables[b, pos // block_size] * block_size + pos % block_size,
            or 0 where done.
        context_lens: [B] int32, written: positions + 1.
        step_uniform: [B] fp32, written: uniform[step].
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".
    """
    check_impl("decode_slots", impl)
    if impl == "eager":
        decode_slots_eager(positions, block_tables, done, block_size, step, uniform, slots, context_lens, step_uniform)
        return
    _check_slots(positions, block_tables, done, block_size, step, uniform, slots, context_lens, step_uniform)
    B, rows = positions.shape[0], _block_rows(positions.device)
    if B:
        _decode_slots_kernel[(triton.cdiv(B, rows),)](
            positions, block_tables, done, step, uniform, slots, context_lens, step_uniform, B,
            block_tables.stride(0), uniform.stride(0), BLOCK_SIZE=block_size, BLOCK_ROWS=rows, num_warps=4)


def _check_tail(tokens: torch.Tensor, logprobs: torch.Tensor, stop_ids: torch.Tensor, limits: torch.Tensor,
                step: torch.Tensor, round_tokens: torch.Tensor, round_logprobs: torch.Tensor, num_new: torch.Tensor,
                done: torch.Tensor, positions: torch.Tensor, input_ids: torch.Tensor) -> None:
    name = "decode_tail"
    B = tokens.shape[0] if tokens.dim() == 1 else -1
    _check_vector(name, "tokens", tokens, B, torch.int64)
    _check_vector(name, "logprobs", logprobs, B, torch.float32)
    if stop_ids.dim() != 1 or stop_ids.dtype != torch.int64 or (stop_ids.shape[0] > 1 and stop_ids.stride(0) != 1):
        raise ValueError(f"{name}: stop_ids must be [S] int64 (S >= 0) with unit stride; got "
                         f"{tuple(stop_ids.shape)} {stop_ids.dtype}")
    _check_vector(name, "limits", limits, B, torch.int64)
    _check_step(name, step)
    _check_rows(name, "round_tokens", round_tokens, B, torch.int64)
    _check_rows(name, "round_logprobs", round_logprobs, B, torch.float32)
    if round_tokens.shape[0] != round_logprobs.shape[0]:
        raise ValueError(f"{name}: round_tokens and round_logprobs must have one number of rows; got "
                         f"{round_tokens.shape[0]} and {round_logprobs.shape[0]}")
    for arg, t, dtype in (("num_new", num_new, torch.int64), ("done", done, torch.bool),
                          ("positions", positions, torch.int64), ("input_ids", input_ids, torch.int64)):
        _check_vector(name, arg, t, B, dtype)
    _check_one_device(name, dict(tokens=tokens, logprobs=logprobs, stop_ids=stop_ids, limits=limits, step=step,
                                 round_tokens=round_tokens, round_logprobs=round_logprobs, num_new=num_new,
                                 done=done, positions=positions, input_ids=input_ids))


def decode_tail_eager(tokens: torch.Tensor, logprobs: torch.Tensor, stop_ids: torch.Tensor, limits: torch.Tensor,
                      step: torch.Tensor, round_tokens: torch.Tensor, round_logprobs: torch.Tensor,
                      num_new: torch.Tensor, done: torch.Tensor, positions: torch.Tensor, input_ids: torch.Tensor,
                      *, impl: str = "eager") -> None:
    """The eager twin (same arguments and writes as `decode_tail`): the engine's torch ops."""
    check_eager_impl("decode_tail_eager", impl)
    _check_tail(tokens, logprobs, stop_ids, limits, step, round_tokens, round_logprobs, num_new, done, positions,
                input_ids)
    round_tokens.index_copy_(0, step, tokens[None])
    round_logprobs.index_copy_(0, step, logprobs[None])
    num_new += ~done
    done |= (num_new >= limits) | torch.isin(tokens, stop_ids)
    going = ~done
    positions += going
    input_ids.copy_(torch.where(going, tokens, input_ids))
    step += 1


def decode_tail(tokens: torch.Tensor, logprobs: torch.Tensor, stop_ids: torch.Tensor, limits: torch.Tensor,
                step: torch.Tensor, round_tokens: torch.Tensor, round_logprobs: torch.Tensor, num_new: torch.Tensor,
                done: torch.Tensor, positions: torch.Tensor, input_ids: torch.Tensor, *, impl: str = "triton") -> None:
    """After a decode step's sampler: record each row's token and log-prob at the round's step, count
    the token of every row not done, mark done the rows that now meet the stop rule, advance the
    others (pending token, position), and move to the next step; all in place.

    Args (B rows; the [B] tensors with unit stride, the 2-D ones with a contiguous last dim):
        tokens: [B] int64, the tokens just sampled.
        logprobs: [B] fp32, their log-probs.
        stop_ids: [S] int64 stop token ids (S may be 0).
        limits: [B] int64, the new tokens each row may hold.
        step: [1] int64, the round's step, incremented.
        round_tokens: [steps, B] int64, row `step` written with tokens; step < steps.
        round_logprobs: [steps, B] fp32, row `step` written with logprobs.
        num_new: [B] int64, new tokens each row holds; +1 where not done.
        done: [B] bool, rows stopped; or-ed with num_new >= limits or a token in stop_ids.
        positions: [B] int64, the pending tokens' positions; +1 where still not done.
        input_ids: [B] int64, the pending tokens; the new token where still not done.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".
    """
    check_impl("decode_tail", impl)
    if impl == "eager":
        decode_tail_eager(tokens, logprobs, stop_ids, limits, step, round_tokens, round_logprobs, num_new, done,
                          positions, input_ids)
        return
    _check_tail(tokens, logprobs, stop_ids, limits, step, round_tokens, round_logprobs, num_new, done, positions,
                input_ids)
    # one program whatever B: it alone reads and then increments `step` (module docstring)
    _decode_tail_kernel[(1,)](
        tokens, logprobs, stop_ids, limits, step, round_tokens, round_logprobs, num_new, done, positions, input_ids,
        tokens.shape[0], stop_ids.shape[0], round_tokens.stride(0), round_logprobs.stride(0),
        BLOCK_ROWS=_block_rows(tokens.device), num_warps=4)
