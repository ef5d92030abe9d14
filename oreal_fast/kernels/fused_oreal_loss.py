"""The OREAL actor loss straight from the LM head: three GEMM-sized passes, no [T, V] logits.

The math this file replaces, as eager code (the twin `fused_oreal_loss_eager`):

    logprobs = linear_logprob(hidden, weight, labels)      # [T] fp32
    terms = oreal_actor_loss(logprobs, inputs, coefs)      # oreal_fast.algo.loss

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
    ActorLossInputs,
    ActorLossTerms,
    LossCoefficients,
    kl_penalty,
    oreal_actor_loss,
    token_coefficients,
)
from oreal_fast.kernels.common import (
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
    mm_fp32,
    tiles_for,
)
from oreal_fast.kernels.linear_logprob import linear_logprob_eager

# Rows per chunk: the fp32 logits chunk is _CHUNK_ROWS * V * 4 bytes (1.2 GiB at V = 151936).
_CHUNK_ROWS = 2048
# Row kernel: vocabulary elements per loop step and warps per row.
_BLOCK_V_CUDA, _WARPS_CUDA = 2048, 8
_BLOCK_V_INTERPRET = 64
_KL_TYPE_IDS = {"unbias": 0, "kl": 1, "mse": 2}


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
    m = tl.full((BLOCK_V,), TL_NEG_BIG, tl.float32)
    s = tl.zeros((BLOCK_V,), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + offs
        y = tl.load(z_row + cols, mask=cols < V, other=TL_NEG_BIG) * TL_LOG2E
        m_new = tl.maximum(m, y)
        s = s * tl.exp2(m - m_new) + tl.exp2(y - m_new)
        m = m_new
    m_all = tl.max(m, 0)
    lse2 = m_all + tl.log2(tl.sum(s * tl.exp2(m - m_all), 0))
    lab = tl.load(L_ptr + r)
    keep = lab != TL_IGNORE_INDEX
    z_lab = tl.load(z_row + tl.where(keep, lab, 0))
    lp = tl.where(keep, z_lab - lse2 * TL_LN2, 0.0)
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
            y = tl.load(z_row + cols, mask=cols < V, other=0.0) * TL_LOG2E
            dz = tl.where(cols == lab, g, 0.0) - tl.exp2(y - lse2) * g
            # The narrower store covers fp32 elements of this step too: all warps read first.
            tl.debug_barrier()
            tl.store(dz_row + cols, dz.to(DZ_ptr.dtype.element_ty), mask=cols < V)


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
    block_v, warps = tiles_for(dev, (_BLOCK_V_CUDA, _WARPS_CUDA), (_BLOCK_V_INTERPRET, 1))
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
        mm_fp32(h_c, weight.t(), z_c)
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
            addmm_fp32_(dW32, dz_c.t(), h_c)
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


def _checked_inputs(inputs: ActorLossInputs, T: int, device: torch.device) -> ActorLossInputs:
    """``inputs`` with every per-token tensor checked ([T], no grad) and on ``device``; ref_logprobs fp32."""
    per_token = {name: _per_token(name, getattr(inputs, name), T, device)
                 for name in ("ref_logprobs", "advantages", "is_positive", "w_pos", "w_neg")}
    per_token["ref_logprobs"] = per_token["ref_logprobs"].float().contiguous()
    return inputs._replace(**per_token)


def fused_oreal_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    inputs: ActorLossInputs,
    coefs: LossCoefficients,
    *,
    impl: str = "triton",
) -> tuple[ActorLossTerms, torch.Tensor]:
    """OREAL actor loss of one micro-batch from the LM head's inputs, without [A, V] logits.

    `oreal_actor_loss` with hidden / weight / labels in place of the log-probs. Differentiable
    with respect to hidden and weight through `terms.loss`; the gradients are formed in the
    forward (skipped under `torch.no_grad` or when neither requires grad). Under autocast, hidden
    and weight are first cast to the autocast dtype (`common.autocast_operands`).

    Args:
        hidden: [A, H] bf16/fp16/fp32, last dim contiguous: final-norm states of the action tokens.
        weight: [V, H] the same dtype, or any floating dtype under autocast (the LM head).
        labels: [A] int64 in [0, V) or -100 (logprob 0, zero gradient).
        inputs: the per-token loss inputs ([A] each) and the step's normalisers.
        coefs: the loss constants, as in `oreal_actor_loss`.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1 with fp32) or "eager".

    Returns:
        (ActorLossTerms, logprobs [A] fp32 detached).
    """
    check_impl("fused_oreal_loss", impl)
    if impl == "eager":
        return fused_oreal_loss_eager(hidden, weight, labels, inputs, coefs)
    hidden, weight = autocast_operands(hidden, weight)
    check_lm_head_inputs("fused_oreal_loss", hidden, weight, labels)
    check_triton_operands("fused_oreal_loss", hidden, weight, others=(labels,))
    inputs = _checked_inputs(inputs, hidden.shape[0], hidden.device)
    a_pos, a_neg, kl_scale = token_coefficients(inputs, coefs)
    a_pos, a_neg, kl_scale = a_pos.contiguous(), a_neg.contiguous(), kl_scale.to(hidden.device)
    grad_on = torch.is_grad_enabled()
    params = _Params(coefs.kl_type, grad_on and hidden.requires_grad, grad_on and weight.requires_grad)
    ref = inputs.ref_logprobs
    with torch.autocast(hidden.device.type, enabled=False):
        if params.grad_hidden or params.grad_weight:
            loss, positive, negative, kl, lp = _FusedOrealLoss.apply(
                hidden, weight, labels, ref, a_pos, a_neg, kl_scale, params)
            return ActorLossTerms(loss, positive, negative, kl), lp
        with torch.no_grad():
            lp, _, _ = _forward(hidden, weight, labels, ref, -a_pos - a_neg, kl_scale, params)
            positive, negative, kl = _loss_values(lp, ref, a_pos, a_neg, kl_scale, coefs.kl_type)
    return ActorLossTerms(positive + negative + kl, positive, negative, kl), lp


def fused_oreal_loss_eager(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    inputs: ActorLossInputs,
    coefs: LossCoefficients,
    *,
    impl: str = "eager",
) -> tuple[ActorLossTerms, torch.Tensor]:
    """The plain-PyTorch twin of `fused_oreal_loss`: `linear_logprob_eager` + `oreal_actor_loss`.

    Same arguments and returns (logprobs fp64 for fp64 inputs); the CPU path and the test oracle.
    """
    check_eager_impl("fused_oreal_loss_eager", impl)
    hidden, weight = autocast_operands(hidden, weight)
    with torch.autocast(hidden.device.type, enabled=False):
        lp = linear_logprob_eager(hidden, weight, labels)
        terms = oreal_actor_loss(lp, inputs, coefs)
    return terms, lp.detach()
