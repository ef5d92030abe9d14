"""Per-token log-probabilities (and entropy) of an LM head without materialising [T, V] logits.

The math this file replaces, as eager code:

    z = (hidden.float() @ weight.float().T) / temperature          # [T, V] fp32
    logprobs = z.log_softmax(-1).gather(-1, labels[:, None])[:, 0]   # [T]
    entropy = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)           # [T]
    logprobs[labels == -100] = entropy[labels == -100] = 0

Forward (`_lse_fwd_kernel`): one pass over the vocabulary. Each program owns a block of tokens
and one slice of the vocabulary; it streams the slice's weight tiles, computes each
[BLOCK_T, BLOCK_V] logits tile with `tl.dot` (fp32 accumulation) and folds it into an online
softmax state per row, in base 2 (y = z * log2 e, so each exponential is one ex2): running max m,
running sum s = sum 2^(y - m) and, for entropy, a = sum 2^(y - m) * (y - m). Keeping a relative to
the running max (not accumulating sum p*z) keeps entropy = ln s - a ln 2 / s free of cancellation
when |z| is large. Slices vary fastest in program order, so the programs running at once share
weight tiles and keep their few hidden blocks in L2. The slices are merged on the host on
[splits, T] tensors; the label logit is one gathered H-wide dot per row.

Backward: for d logprob / d z = onehot(label) - p and d entropy / d z = -p * (z - lse + entropy),
the logits gradient of a row is dz = g_lp * onehot - p * (g_lp + g_ent * (z - lse + entropy)).
`_dz_kernel` recomputes the logits of one vocabulary chunk [T, Vc] and writes dz there (in the
input dtype); two library GEMMs then give dW[chunk] = dz^T @ hidden (complete: the reduction over
all T runs inside one GEMM with fp32 accumulation) and dH += dz @ W[chunk] (an fp32 product added
into an fp32 [T, H] buffer). The chunk holds at most `_DZ_CHUNK_BYTES`, whatever T is, rounded up
to one tile column.

Never allocated: any [T, V] tensor. Allocated: partial softmax states [splits, T] fp32, saved
lse (and entropy) [T] fp32 when a gradient is needed, the dz chunk (<= `_DZ_CHUNK_BYTES`) and the
fp32 dH accumulator [T, H] in backward. Under `torch.no_grad` nothing is saved.

FLOPs: forward 2*T*V*H; backward 6*T*V*H (logits recompute, dH, dW). All reductions, the
softmax state, lse, logprobs and entropy are fp32; dH and dW accumulate in fp32.

On an H200 (T = 16384, H = 896, V = 151936, bf16): forward 8.7 ms, forward + backward 34.5 ms,
0.49 GiB above the inputs, gradients included (benchmarks/RESULTS.md).

Limits: dz is rounded to the input dtype before the two GEMMs, so in bf16 dH and dW carry about
2e-3 relative error (logprobs and entropy about 1e-6). Four GEMM-sized passes per training step:
the gradient of the loss is not known during the forward, so the logits are computed twice.
Labels must be in [0, V) or -100 (checked on the device, without a host sync); the last
dimension of hidden and weight must be contiguous; on CPU the Triton path runs only under
TRITON_INTERPRET=1 and only with fp32 inputs (the interpreter's low-precision dot is wrong).
Rows with label -100 get logprob 0, entropy 0 and exactly zero gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from oreal_fast.kernels.common import (
    IGNORE_INDEX,
    TL_IGNORE_INDEX,
    TL_LN2,
    TL_LOG2E,
    TL_NEG_BIG,
    addmm_fp32_,
    autocast_operands,
    check_eager_impl,
    check_impl,
    check_lm_head_inputs,
    check_triton_operands,
    dot_precision,
    multiprocessor_count,
    tiles_for,
)

# Upper bound on the backward's dz chunk ([T, Vc] in the input dtype). 128 MiB keeps the whole
# backward (dW, dH fp32 accumulator, chunk) near 0.5 GiB at T = 16384, V = 151936.
_DZ_CHUNK_BYTES = 128 * 2**20
# Forward grid: token blocks x vocabulary splits, at least `_MIN_SPLITS` splits (see the kernel's
# program order) and about `_PROGRAMS_PER_SM` programs per multiprocessor for short batches.
_MIN_SPLITS = 4
_PROGRAMS_PER_SM = 2
# Eager twin: rows per chunk so that one fp32/fp64 logits chunk holds about this many elements.
_EAGER_CHUNK_ELEMS = 2**24


@dataclass(frozen=True)
class _Blocks:
    """Tile sizes and launch shape of one kernel."""

    t: int
    v: int
    k: int
    num_warps: int
    num_stages: int


# Picked on an H200 by benchmarks/sweep_linear_logprob.py; the interpreter gets small tiles.
_FWD_BLOCKS_CUDA = _Blocks(t=128, v=256, k=64, num_warps=8, num_stages=3)
_DZ_BLOCKS_CUDA = _Blocks(t=128, v=256, k=64, num_warps=8, num_stages=3)
_BLOCKS_INTERPRET = _Blocks(t=16, v=32, k=16, num_warps=1, num_stages=1)


@triton.jit
def _lse_fwd_kernel(
    H_ptr, W_ptr, L_ptr, M_ptr, S_ptr, A_ptr, ZL_ptr,
    T, V, K, stride_ht, stride_wv, inv_temp, num_splits,
    HAS_ENT: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # Splits vary fastest: the programs running at once cover few token blocks (their hidden
    # rows stay in L2) and every split (each W tile is shared by those token blocks).
    pid = tl.program_id(0)
    pid_s = pid % num_splits
    pid_t = pid // num_splits
    # int64 row offsets: T * stride and V * stride overflow int32 at real shapes.
    rows = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    row_ok = rows < T
    rk = tl.arange(0, BLOCK_K)

    num_tiles = tl.cdiv(V, BLOCK_V)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    v_lo = pid_s * tiles_per_split * BLOCK_V
    v_hi = tl.minimum(v_lo + tiles_per_split * BLOCK_V, V)

    m = tl.full((BLOCK_T,), TL_NEG_BIG, tl.float32)
    s = tl.zeros((BLOCK_T,), tl.float32)
    a = tl.zeros((BLOCK_T,), tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < v_hi
        acc = tl.zeros((BLOCK_T, BLOCK_V), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + rk) < K
            h = tl.load(H_ptr + rows[:, None] * stride_ht + (k0 + rk)[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(W_ptr + cols[:, None] * stride_wv + (k0 + rk)[None, :],
                        mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PREC)
        # Base-2 logits y = z * log2(e) so that exp is one ex2 instruction.
        # Columns past this split's end must not count: a finite stand-in keeps 0 * y at 0.
        y = tl.where(col_ok[None, :], acc * (inv_temp * TL_LOG2E), TL_NEG_BIG)
        m_new = tl.maximum(m, tl.max(y, 1))
        alpha = tl.exp2(m - m_new)
        e = tl.exp2(y - m_new[:, None])
        if HAS_ENT:
            # Re-base a from the old max to the new one: sum e'(y - m') = alpha (a + (m - m') s).
            a = alpha * (a + (m - m_new) * s) + tl.sum(e * (y - m_new[:, None]), 1)
        s = s * alpha + tl.sum(e, 1)
        m = m_new

    out = pid_s * T + rows
    tl.store(M_ptr + out, m, mask=row_ok)
    tl.store(S_ptr + out, s, mask=row_ok)
    if HAS_ENT:
        tl.store(A_ptr + out, a, mask=row_ok)
    if pid_s == 0:
        # The label logit as one gathered dot per row (fp32 products of the stored inputs).
        lab = tl.load(L_ptr + rows, mask=row_ok, other=0)
        lab = tl.where(lab < 0, 0, lab)
        zl = tl.zeros((BLOCK_T,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + rk) < K
            h = tl.load(H_ptr + rows[:, None] * stride_ht + (k0 + rk)[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(W_ptr + lab[:, None] * stride_wv + (k0 + rk)[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            zl += tl.sum(h.to(tl.float32) * w.to(tl.float32), 1)
        tl.store(ZL_ptr + rows, zl * inv_temp, mask=row_ok)


@triton.jit
def _dz_kernel(
    H_ptr, W_ptr, L_ptr, LSE_ptr, GL_ptr, GE_ptr, ENT_ptr, DZ_ptr,
    T, V, K, v_lo, v_hi, stride_ht, stride_wv, stride_dzt, inv_temp,
    HAS_ENT: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # Vocabulary blocks vary fastest: the chunk's W rows stay in L2 and each token block is
    # read from memory about once.
    num_vb = tl.cdiv(v_hi - v_lo, BLOCK_V)
    pid = tl.program_id(0)
    pid_v = pid % num_vb
    pid_t = pid // num_vb
    rows = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    cols = (v_lo + pid_v * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    row_ok = rows < T
    col_ok = cols < v_hi
    rk = tl.arange(0, BLOCK_K)

    acc = tl.zeros((BLOCK_T, BLOCK_V), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        h = tl.load(H_ptr + rows[:, None] * stride_ht + (k0 + rk)[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W_ptr + cols[:, None] * stride_wv + (k0 + rk)[None, :],
                    mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PREC)
    lse = tl.load(LSE_ptr + rows, mask=row_ok, other=0.0)
    # log2 p = z * log2(e) - lse * log2(e): p is one ex2 instruction.
    log2p = acc * (inv_temp * TL_LOG2E) - lse[:, None] * TL_LOG2E
    # g_lp (and g_ent) are already zero on ignored rows, which makes the whole row of dz zero.
    g_lp = tl.load(GL_ptr + rows, mask=row_ok, other=0.0)
    lab = tl.load(L_ptr + rows, mask=row_ok, other=TL_IGNORE_INDEX)
    p = tl.exp2(log2p)
    c = tl.broadcast_to(g_lp[:, None], (BLOCK_T, BLOCK_V))
    if HAS_ENT:
        g_ent = tl.load(GE_ptr + rows, mask=row_ok, other=0.0)
        ent = tl.load(ENT_ptr + rows, mask=row_ok, other=0.0)
        # z - lse + entropy = ln p + entropy.
        c = c + g_ent[:, None] * (log2p * TL_LN2 + ent[:, None])
    dz = tl.where(cols[None, :] == lab[:, None], g_lp[:, None], 0.0) - p * c
    # d z / d (h . w) = 1 / temperature.
    dz = dz * inv_temp
    tl.store(DZ_ptr + rows[:, None] * stride_dzt + (cols - v_lo)[None, :],
             dz.to(DZ_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _blocks(device: torch.device, dtype: torch.dtype, cuda_blocks: _Blocks) -> _Blocks:
    b = tiles_for(device, cuda_blocks, _BLOCKS_INTERPRET)
    # fp32 operands take twice the shared memory per stage: halve the K tile to fit.
    return replace(b, k=b.k // 2) if device.type == "cuda" and dtype == torch.float32 else b


def _num_splits(T: int, block_t: int, device: torch.device) -> int:
    """Vocabulary splits of the forward grid (two in the interpreter, to test the merge)."""
    if device.type != "cuda":
        return 2
    num_sms = multiprocessor_count(device)
    row_blocks = max(1, triton.cdiv(T, block_t))  # T = 0: an empty grid, any split count
    return max(_MIN_SPLITS, round(_PROGRAMS_PER_SM * num_sms / row_blocks))


def _check_inputs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                  temperature: float) -> None:
    check_lm_head_inputs("linear_logprob", hidden, weight, labels)
    if not temperature > 0:
        raise ValueError(f"linear_logprob: temperature must be > 0, got {temperature}")


def _forward(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
             inv_temp: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launches the forward kernel and merges the vocabulary splits.

    Returns:
        logprobs: [T] fp32 (0 on ignored rows), lse: [T] fp32, entropy: [T] fp32 or None.
    """
    T, K = hidden.shape
    V = weight.shape[0]
    b = _blocks(hidden.device, hidden.dtype, _FWD_BLOCKS_CUDA)
    S = _num_splits(T, b.t, hidden.device)
    m, s, a = (torch.empty((S, T), dtype=torch.float32, device=hidden.device) for _ in range(3))
    zl = torch.empty(T, dtype=torch.float32, device=hidden.device)
    _lse_fwd_kernel[(triton.cdiv(T, b.t) * S,)](
        hidden, weight, labels, m, s, a, zl,
        T, V, K, hidden.stride(0), weight.stride(0), inv_temp, S,
        HAS_ENT=with_entropy, DOT_PREC=dot_precision(hidden.dtype),
        BLOCK_T=b.t, BLOCK_V=b.v, BLOCK_K=b.k, num_warps=b.num_warps, num_stages=b.num_stages,
    )
    # m and a are in base-2 units (log2 of the logits' exp), s is a plain sum.
    m_all = m.amax(0)  # [T]
    scale = torch.exp2(m - m_all)  # [S, T]
    s_all = (s * scale).sum(0)
    lse = (m_all + torch.log2(s_all)) * math.log(2)
    ignored = labels == IGNORE_INDEX
    logprobs = torch.where(ignored, 0.0, zl - lse)
    entropy = None
    if with_entropy:
        a_all = (scale * (a + (m - m_all) * s)).sum(0)
        entropy = torch.where(ignored, 0.0, torch.log(s_all) - a_all / s_all * math.log(2))
    return logprobs, lse, entropy


def _backward(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
              entropy: torch.Tensor | None, g_lp: torch.Tensor, g_ent: torch.Tensor | None,
              inv_temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """dH [T, H] and dW [V, H] (input dtype) from the per-token gradients, chunk by chunk over V."""
    T, K = hidden.shape
    V = weight.shape[0]
    b = _blocks(hidden.device, hidden.dtype, _DZ_BLOCKS_CUDA)
    ignored = labels == IGNORE_INDEX
    g_lp = torch.where(ignored, 0.0, g_lp.float()).contiguous()
    has_ent = g_ent is not None
    if has_ent:
        g_ent = torch.where(ignored, 0.0, g_ent.float()).contiguous()
    dW = torch.empty_like(weight)
    dH = torch.zeros((T, K), dtype=torch.float32, device=hidden.device)
    rows_bytes = max(T, 1) * hidden.element_size()
    v_chunk = max(b.v, _DZ_CHUNK_BYTES // rows_bytes // b.v * b.v)
    dz = torch.empty((T, min(v_chunk, V)), dtype=hidden.dtype, device=hidden.device)
    for v_lo in range(0, V, v_chunk):
        v_hi = min(v_lo + v_chunk, V)
        dz_c = dz[:, : v_hi - v_lo]
        grid = (triton.cdiv(T, b.t) * triton.cdiv(v_hi - v_lo, b.v),)
        _dz_kernel[grid](
            hidden, weight, labels, lse, g_lp, g_ent if has_ent else g_lp,
            entropy if has_ent else lse, dz_c,
            T, V, K, v_lo, v_hi, hidden.stride(0), weight.stride(0), dz_c.stride(0), inv_temp,
            HAS_ENT=has_ent, DOT_PREC=dot_precision(hidden.dtype),
            BLOCK_T=b.t, BLOCK_V=b.v, BLOCK_K=b.k, num_warps=b.num_warps, num_stages=b.num_stages,
        )
        # dW rows of this chunk are complete: the GEMM reduces over all T in fp32.
        torch.mm(dz_c.t(), hidden, out=dW[v_lo:v_hi])
        addmm_fp32_(dH, dz_c, weight[v_lo:v_hi])
    return dH.to(hidden.dtype), dW


@dataclass(frozen=True)
class _Params:
    """Options of one call, handed to the autograd Function as one object."""

    inv_temp: float
    return_entropy: bool


class _LinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                params: _Params):
        logprobs, lse, entropy = _forward(hidden, weight, labels, params.inv_temp,
                                          params.return_entropy)
        ctx.params = params
        ctx.save_for_backward(hidden, weight, labels, lse, entropy)
        ctx.set_materialize_grads(False)
        return (logprobs, entropy) if params.return_entropy else logprobs

    @staticmethod
    def backward(ctx, g_lp: torch.Tensor | None, g_ent: torch.Tensor | None = None):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        if g_lp is None and g_ent is None:
            return None, None, None, None
        if g_lp is None:
            g_lp = torch.zeros_like(lse)
        dH, dW = _backward(hidden, weight, labels, lse, entropy, g_lp, g_ent, ctx.params.inv_temp)
        return (dH if ctx.needs_input_grad[0] else None,
                dW if ctx.needs_input_grad[1] else None, None, None)


def linear_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    impl: str = "triton",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(hidden @ weight.T / temperature)[label] per token, without [T, V] logits.

    Differentiable with respect to hidden and weight (through logprobs and entropy). Under
    `torch.no_grad` (or with no input requiring grad) it is a single forward pass that saves nothing.
    Under autocast, hidden and weight are first cast to the autocast dtype, as a matmul's operands
    would be (`common.autocast_operands`); the rest computes with autocast off.

    Args:
        hidden: [T, H] bf16/fp16/fp32, last dim contiguous.
        weight: [V, H] the same dtype, or any floating dtype under autocast (the LM head).
        labels: [T] int64 in [0, V) or -100 (ignored: logprob 0, entropy 0, zero gradient).
        temperature: logits are divided by it (> 0).
        return_entropy: also return the entropy of softmax(logits / temperature).
        impl: "triton" (the kernels; on CPU only under TRITON_INTERPRET=1 with fp32) or "eager".

    Returns:
        logprobs: [T] fp32, or (logprobs [T] fp32, entropy [T] fp32) if return_entropy.
    """
    check_impl("linear_logprob", impl)
    if impl == "eager":
        return linear_logprob_eager(hidden, weight, labels, temperature=temperature,
                                    return_entropy=return_entropy)
    hidden, weight = autocast_operands(hidden, weight)
    _check_inputs(hidden, weight, labels, temperature)
    check_triton_operands("linear_logprob", hidden, weight, others=(labels,))
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(hidden.device.type, enabled=False):
        if needs_grad:
            return _LinearLogprob.apply(hidden, weight, labels, _Params(1.0 / temperature, return_entropy))
        with torch.no_grad():
            logprobs, _, entropy = _forward(hidden, weight, labels, 1.0 / temperature, return_entropy)
    return (logprobs, entropy) if return_entropy else logprobs


def _eager_chunk(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                 temperature: float, return_entropy: bool) -> tuple[torch.Tensor, ...]:
    """(logprobs,) or (logprobs, entropy) of one chunk of rows, [Tc] each."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    z = (hidden.to(dtype) @ weight.to(dtype).T) / temperature  # (Tc, V)
    logp_all = z.log_softmax(-1)
    ignored = labels == IGNORE_INDEX
    logp = logp_all.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    logp = torch.where(ignored, 0.0, logp)
    if not return_entropy:
        return (logp,)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, torch.where(ignored, 0.0, entropy)


def linear_logprob_eager(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    impl: str = "eager",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The plain-PyTorch twin of `linear_logprob` (the CPU path and the test oracle).

    Computes in fp32 (fp64 for fp64 inputs), over chunks of rows; under autograd each chunk is
    recomputed in backward (activation checkpointing), so memory stays bounded by one chunk.
    Same arguments and returns as `linear_logprob` (autocast included); logprobs/entropy come
    back as fp32, or fp64 for fp64 inputs.
    """
    check_eager_impl("linear_logprob_eager", impl)
    hidden, weight = autocast_operands(hidden, weight)
    _check_inputs(hidden, weight, labels, temperature)
    with torch.autocast(hidden.device.type, enabled=False):
        return _eager_chunks(hidden, weight, labels, temperature, return_entropy)


def _eager_chunks(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                  temperature: float, return_entropy: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`_eager_chunk` over row chunks, each recomputed in backward when a gradient is needed."""
    rows = max(1, _EAGER_CHUNK_ELEMS // max(weight.shape[0], 1))
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    parts = []
    # An empty batch still runs one (empty) chunk, so its outputs stay in the autograd graph.
    for t0 in range(0, max(hidden.shape[0], 1), rows):
        args = (hidden[t0:t0 + rows], weight, labels[t0:t0 + rows], temperature, return_entropy)
        if needs_grad:
            parts.append(torch.utils.checkpoint.checkpoint(_eager_chunk, *args, use_reentrant=False))
        else:
            parts.append(_eager_chunk(*args))
    logprobs = torch.cat([p[0] for p in parts])
    if not return_entropy:
        return logprobs
    return logprobs, torch.cat([p[1] for p in parts])
