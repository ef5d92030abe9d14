"""The OREAL actor loss straight from the LM head: three GEMM-sized passes, no [T, V] logits.

The math this file replaces, as eager code (the twin `fused_oreal_loss_eager`):

    logprobs = linear_logprob(hidden, weight, labels)                  # [T] fp32
    terms = oreal_actor_loss(logprobs, ref_logprobs, advantages, ...)  # oreal_fast.algo.loss

Why it is faster: the loss's gradient with respect to each log-prob is known in closed form as
soon as that log-prob is, g = -a+ - a- + kappa/N_act * k'(l, lref) (`oreal_logprob_grad`), so the
logits gradient dz = g * (onehot(label) - softmax(z)) can be formed in the forward while the
logits are at hand. `linear_logprob` has to recompute them in backward (four passes: forward,
recompute, dH, dW); here there are three (logits, dH, dW).

How (`_forward`): the rows are processed in chunks of `_CHUNK_ROWS` (constant, so memory does not
grow with T). Per chunk: (1) a library GEMM writes the fp32 logits [C, V]; (2) `_rows_kernel`,
one program per row, finds lse over V (online max / sum of exponentials, fp32, base 2), the
log-prob z[label] - lse and g, then overwrites the row in place with dz (in the input dtype,
packed into the front of the fp32 row); (3) dH[chunk] = dz @ W (complete: it reduces over V);
(4) dW += dz^T @ h[chunk] into an fp32 accumulator. The autograd Function's forward returns the
loss and saves dH and dW; its backward scales them by the incoming gradient of the loss. Under
`torch.no_grad` (or with no input requiring grad) only (1) and the lse half of (2) run.

Invariant: loss terms and logprobs equal those of `fused_oreal_loss_eager` (up to rounding), and
the gradients equal autograd's through it. Rows with label -100 get logprob 0 and exactly zero
gradient; like the eager loss, their log-prob 0 still enters the negative and KL terms' values.

Allocated: the logits chunk [C, V] fp32, the fp32 dW accumulator [V, H], dH and dW in the input
dtype (saved until backward). Never: any [T, V] tensor.

On an H200 (T = 16384, H = 896, V = 151936, bf16): loss forward + backward 30.3 ms (linear_logprob
+ oreal_actor_loss: 34.8 ms, torch.compile: 31.9 ms), 1.95 GiB above the inputs, gradients
included; relative error vs fp64: loss and logprobs 7e-7, dH and dW 2.4e-3 (benchmarks/RESULTS.md).

Limits: the logits gradient is rounded to the input dtype before the two gradient GEMMs (bf16:
about 2e-3 relative error in dH and dW, as in `linear_logprob`). No temperature (training uses
1). No gradient flows to ref_logprobs, advantages or the RM weights (they must not require grad).
The gradient is formed in the forward, so it costs the same whether or not backward runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from oreal_fast.algo.loss import (
    ActorLossTerms,
    LossCoefficients,
    kl_penalty,
    oreal_actor_loss,
    token_coefficients,
)
from oreal_fast.algo.normalisers import Normalisers
from oreal_fast.kernels.linear_logprob import (
    IGNORE_INDEX,
    IMPLS,
    _check_inputs,
    _check_triton,
    linear_logprob_eager,
)

# Rows per chunk: the fp32 logits chunk is _CHUNK_ROWS * V * 4 bytes (1.2 GiB at V = 151936).
_CHUNK_ROWS = 2048
# Row kernel: vocabulary elements per loop step and warps per row.
_BLOCK_V_CUDA, _WARPS_CUDA = 2048, 8
_BLOCK_V_INTERPRET = 64
_KL_TYPE_IDS = {"unbias": 0, "kl": 1, "mse": 2}
_IGNORE = tl.constexpr(IGNORE_INDEX)
# Stand-in for -inf in the online softmax: exp2 of it is 0, never NaN.
_NEG_BIG = tl.constexpr(-1.0e30)
_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _rows_kernel(
    Z_ptr, DZ_ptr, L_ptr, REF_ptr, C0_ptr, KL_ptr, LP_ptr,
    V, stride_z, stride_dz,
    KL_TYPE: tl.constexpr, WRITE_DZ: tl.constexpr, BLOCK_V: tl.constexpr,
):
    # One program per row of the chunk; Z_ptr, L_ptr, ... already point at the chunk's first row.
    r = tl.program_id(0).to(tl.int64)
    z_row = Z_ptr + r * stride_z
    offs = tl.arange(0, BLOCK_V)
    # Per-lane online softmax state in base 2 (y = z log2 e), merged across lanes at the end.
    m = tl.full((BLOCK_V,), _NEG_BIG, tl.float32)
    s = tl.zeros((BLOCK_V,), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + offs
        y = tl.load(z_row + cols, mask=cols < V, other=_NEG_BIG) * _LOG2E
        m_new = tl.maximum(m, y)
        s = s * tl.exp2(m - m_new) + tl.exp2(y - m_new)
        m = m_new
    m_all = tl.max(m, 0)
    lse2 = m_all + tl.log2(tl.sum(s * tl.exp2(m - m_all), 0))
    lab = tl.load(L_ptr + r)
    keep = lab != _IGNORE
    z_lab = tl.load(z_row + tl.where(keep, lab, 0))
    lp = tl.where(keep, z_lab - lse2 * _LN2, 0.0)
    tl.store(LP_ptr + r, lp)
    if WRITE_DZ:
        ref = tl.load(REF_ptr + r)
        if KL_TYPE == 0:
            dk = 1.0 - tl.exp(ref - lp)
        elif KL_TYPE == 1:
            dk = -1.0
        else:
            dk = lp - ref
        # g = dL/dl; zero on ignored rows, which makes the whole row of dz zero.
        g = tl.where(keep, tl.load(C0_ptr + r) + tl.load(KL_ptr) * dk, 0.0)
        dz_row = DZ_ptr + r * stride_dz
        # dz overwrites the row it is computed from (packed to its front when narrower than
        # fp32): every warp must have read the label logit before any warp writes.
        tl.debug_barrier()
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs
            y = tl.load(z_row + cols, mask=cols < V, other=0.0) * _LOG2E
            dz = tl.where(cols == lab, g, 0.0) - tl.exp2(y - lse2) * g
            # The narrower store covers fp32 elements of this step too: all warps read first.
            tl.debug_barrier()
            tl.store(dz_row + cols, dz.to(DZ_ptr.dtype.element_ty), mask=cols < V)


def _mm_fp32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b, out fp32, a and b fp32 or bf16/fp16 (fp32 accumulation)."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
        return
    try:
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    except RuntimeError:
        # torch builds without the out= form of the mixed-dtype GEMM: one temporary chunk.
        out.copy_(torch.mm(a, b, out_dtype=torch.float32))


def _addmm_fp32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b with acc fp32 and a, b possibly bf16/fp16 (fp32 accumulation throughout)."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
        return
    try:
        # One GEMM reading and writing the fp32 accumulator (beta = 1).
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    except RuntimeError:
        # torch builds whose mixed-dtype addmm wants `acc` in the inputs' dtype.
        acc += torch.mm(a, b, out_dtype=torch.float32)


@dataclass(frozen=True)
class _Params:
    """Options of one call, handed to the autograd Function as one object."""

    kl_type: str
    grad_hidden: bool
    grad_weight: bool


def _forward(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
             ref: torch.Tensor, c0: torch.Tensor, kl_scale: torch.Tensor, params: _Params
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-probs and, when asked, the loss's dH and dW, chunk by chunk over the rows.

    Args:
        ref: [T] fp32 reference log-probs; c0: [T] fp32, -a+ - a-; kl_scale: 0-d fp32.

    Returns:
        logprobs [T] fp32 (0 on ignored rows), dH [T, H] and dW [V, H] in the input dtype (or
        None where not asked).
    """
    T, K = hidden.shape
    V = weight.shape[0]
    dev = hidden.device
    with_grad = params.grad_hidden or params.grad_weight
    on_cuda = dev.type == "cuda"
    block_v = _BLOCK_V_CUDA if on_cuda else _BLOCK_V_INTERPRET
    warps = _WARPS_CUDA if on_cuda else 1
    lp = torch.empty(T, dtype=torch.float32, device=dev)
    dH = torch.empty_like(hidden) if params.grad_hidden else None
    dW32 = torch.zeros((V, K), dtype=torch.float32, device=dev) if params.grad_weight else None
    rows = min(_CHUNK_ROWS, max(T, 1))
    z = torch.empty((rows, V), dtype=torch.float32, device=dev)
    # dz in the input dtype, packed to the front of each fp32 logits row (same row stride in bytes).
    z_as_in = z.view(hidden.dtype)
    for t0 in range(0, T, rows):
        t1 = min(t0 + rows, T)
        z_c, h_c = z[: t1 - t0], hidden[t0:t1]
        _mm_fp32(h_c, weight.t(), z_c)
        dz_c = z_as_in[: t1 - t0, :V]
        _rows_kernel[(t1 - t0,)](
            z_c, dz_c, labels[t0:], ref[t0:], c0[t0:], kl_scale, lp[t0:],
            V, z_c.stride(0), dz_c.stride(0),
            KL_TYPE=_KL_TYPE_IDS[params.kl_type], WRITE_DZ=with_grad, BLOCK_V=block_v,
            num_warps=warps,
        )
        if params.grad_hidden:
            torch.mm(dz_c, weight, out=dH[t0:t1])
        if params.grad_weight:
            _addmm_fp32_(dW32, dz_c.t(), h_c)
    dW = None
    if dW32 is not None:
        dW = dW32 if weight.dtype == torch.float32 else dW32.to(weight.dtype)
    return lp, dH, dW


def _loss_values(lp: torch.Tensor, ref: torch.Tensor, a_pos: torch.Tensor, a_neg: torch.Tensor,
                 kl_scale: torch.Tensor, kl_type: str) -> tuple[torch.Tensor, ...]:
    """positive, negative, kl: 0-d fp32, the values of oreal_actor_loss's terms at lp."""
    positive = (a_pos * -lp).sum()
    # The negative term's ratio exp(l - sg(l)) is 1 in value.
    negative = -a_neg.sum()
    kl = kl_scale * kl_penalty(lp, ref, kl_type).sum()
    return positive, negative, kl


class _FusedOrealLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                ref: torch.Tensor, a_pos: torch.Tensor, a_neg: torch.Tensor,
                kl_scale: torch.Tensor, params: _Params):
        lp, dH, dW = _forward(hidden, weight, labels, ref, -a_pos - a_neg, kl_scale, params)
        positive, negative, kl = _loss_values(lp, ref, a_pos, a_neg, kl_scale, params.kl_type)
        ctx.save_for_backward(dH, dW)
        ctx.mark_non_differentiable(positive, negative, kl, lp)
        return positive + negative + kl, positive, negative, kl, lp

    @staticmethod
    def backward(ctx, g_loss: torch.Tensor, *_unused):
        dH, dW = ctx.saved_tensors
        scaled = [None if d is None else d * g_loss.to(d.dtype) for d in (dH, dW)]
        return (*scaled, None, None, None, None, None, None)


def _per_token(name: str, x: torch.Tensor | None, T: int, device: torch.device
               ) -> torch.Tensor | None:
    """x ([T], no grad) on the device, or None; a clear error naming x otherwise."""
    if x is None:
        return None
    if x.shape != (T,):
        raise ValueError(f"fused_oreal_loss: {name} must be [T] with T = {T}; got {tuple(x.shape)}")
    if x.requires_grad:
        raise ValueError(f"fused_oreal_loss: {name} must not require grad "
                         "(no gradient flows to it)")
    return x.to(device)


def fused_oreal_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    is_positive: torch.Tensor,
    w_pos: torch.Tensor | None,
    w_neg: torch.Tensor | None,
    norm: Normalisers,
    coefs: LossCoefficients,
    *,
    impl: str = "triton",
) -> tuple[ActorLossTerms, torch.Tensor]:
    """OREAL actor loss of one micro-batch from the LM head's inputs, without [A, V] logits.

    `oreal_actor_loss` with hidden / weight / labels in place of the log-probs. Differentiable
    with respect to hidden and weight through `terms.loss`; the gradients are formed in the
    forward (skipped under `torch.no_grad` or when neither requires grad).

    Args:
        hidden: [A, H] bf16/fp16/fp32, last dim contiguous: final-norm states of the action tokens.
        weight: [V, H] same dtype (the LM head).
        labels: [A] int64 in [0, V) or -100 (logprob 0, zero gradient).
        ref_logprobs: [A] reference log-probs.
        advantages: [A] fp32, each token carries its sequence's A_i.
        is_positive: [A] bool, its sequence's reward > 0.
        w_pos, w_neg: [A] RM token weights, or None (weight 1).
        norm: the step's global normalisers.
        coefs: the loss constants, as in `oreal_actor_loss`.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1 with fp32) or "eager".

    Returns:
        (ActorLossTerms, logprobs [A] fp32 detached).
    """
    if impl not in IMPLS:
        raise ValueError(f"fused_oreal_loss: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "eager":
        return fused_oreal_loss_eager(hidden, weight, labels, ref_logprobs, advantages,
                                      is_positive, w_pos, w_neg, norm, coefs)
    _check_inputs(hidden, weight, labels, 1.0)
    _check_triton(hidden, weight, labels)
    T, dev = hidden.shape[0], hidden.device
    ref = _per_token("ref_logprobs", ref_logprobs, T, dev).float().contiguous()
    adv = _per_token("advantages", advantages, T, dev)
    pos = _per_token("is_positive", is_positive, T, dev)
    w_pos = _per_token("w_pos", w_pos, T, dev)
    w_neg = _per_token("w_neg", w_neg, T, dev)
    a_pos, a_neg, kl_scale = token_coefficients(adv, pos, w_pos, w_neg, norm, coefs)
    a_pos, a_neg, kl_scale = a_pos.contiguous(), a_neg.contiguous(), kl_scale.to(dev)
    grad_on = torch.is_grad_enabled()
    params = _Params(coefs.kl_type, grad_on and hidden.requires_grad, grad_on and weight.requires_grad)
    if not (params.grad_hidden or params.grad_weight):
        with torch.no_grad():
            lp, _, _ = _forward(hidden, weight, labels, ref, -a_pos - a_neg, kl_scale, params)
            positive, negative, kl = _loss_values(lp, ref, a_pos, a_neg, kl_scale, coefs.kl_type)
        return ActorLossTerms(positive + negative + kl, positive, negative, kl), lp
    loss, positive, negative, kl, lp = _FusedOrealLoss.apply(
        hidden, weight, labels, ref, a_pos, a_neg, kl_scale, params)
    return ActorLossTerms(loss, positive, negative, kl), lp


def fused_oreal_loss_eager(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    is_positive: torch.Tensor,
    w_pos: torch.Tensor | None,
    w_neg: torch.Tensor | None,
    norm: Normalisers,
    coefs: LossCoefficients,
    *,
    impl: str = "eager",
) -> tuple[ActorLossTerms, torch.Tensor]:
    """The plain-PyTorch twin of `fused_oreal_loss`: `linear_logprob_eager` + `oreal_actor_loss`.

    Same arguments and returns (logprobs fp64 for fp64 inputs); the CPU path and the test oracle.
    """
    if impl != "eager":
        raise ValueError(f"fused_oreal_loss_eager: impl must be 'eager', got {impl!r}")
    lp = linear_logprob_eager(hidden, weight, labels)
    terms = oreal_actor_loss(lp, ref_logprobs, advantages, is_positive, w_pos, w_neg, norm, coefs)
    return terms, lp.detach()
