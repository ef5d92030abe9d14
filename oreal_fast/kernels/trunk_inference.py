"""The decoder trunk's elementwise ops for inference, one Triton kernel each: RMSNorm, rotary
embedding and the SwiGLU activation.

Eager, each of these is a chain of small kernels (RMSNorm: cast, square, mean, add, rsqrt,
multiply, cast, multiply; rope: two table casts, negate, concatenate, two multiplies, add; SwiGLU:
silu, multiply), about 30 per layer. In a decode step of a 0.5B model at batch 256 each of them
moves a few hundred KB and costs a launch-sized slot of GPU time (~2-3 us on an H200), so together
they take more GPU time than the layer's matmuls. Here each op is one pass over its rows.

The math, as the eager twins compute it (transformers' Llama/Qwen2 op for op, every
intermediate rounded to the activation dtype where transformers rounds it):

    rms_norm(x, w, eps)     = w * (x32 * rsqrt(mean(x32^2, -1) + eps)).to(dtype),  x32 = x.float()
    apply_rope(x, cos, sin) = x * cos + cat(-x2, x1) * sin,   x = [x1 | x2] on the last dim,
                              cos and sin cast to x's dtype first
    silu_mul(g, u)          = silu(g) * u

The kernels load in fp32, round where the eager ops round, and store in the input dtype, so they
equal the twins up to the fp32 rounding of the RMSNorm sum and of exp, and (rope, on the GPU) a
product and sum the compiler contracts into one fused multiply-add: one bf16 ulp here and there.

Budget: one read of each input and one write of the output; no workspace; no host sync, so a CUDA
graph captures them. RMSNorm: one program per row (H <= 16384 in one block). Rope: one program per
token, all its heads. SwiGLU: flat blocks of 1024 elements.

Forward only, no autograd: the rollout engine's weight copy uses them (`Decoder(...,
trunk_ops=INFERENCE_OPS)`); the trained models keep the eager ops of `oreal_fast.model.decoder`,
whose backward autograd derives. The twins here are those eager ops with the kernels' signature.
On CPU the Triton path runs only under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oreal_fast.model import decoder as model

IMPLS = ("triton", "eager")
_SILU_BLOCK = 1024


# ---------------------------------------------------------------------------------- RMSNorm

@triton.jit
def _rms_norm_kernel(X_ptr, W_ptr, Out_ptr, H, stride_x, stride_out, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    x = tl.load(X_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
    normed = (x * rstd).to(Out_ptr.dtype.element_ty).to(tl.float32)  # rounded before the weight
    tl.store(Out_ptr + row * stride_out + offs, (w * normed).to(Out_ptr.dtype.element_ty), mask=mask)


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments and result as `rms_norm`): the model's own op."""
    return model.rms_norm(x, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, impl: str = "triton") -> torch.Tensor:
    """RMSNorm over the last dim with fp32 statistics.

    Args:
        x: [T, H] bf16/fp16/fp32, last dim contiguous.
        weight: [H], same dtype.
        eps: added to the mean square.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        [T, H] in x's dtype.
    """
    _check_impl(impl, "rms_norm")
    if impl == "eager":
        return rms_norm_eager(x, weight, eps)
    if x.dim() != 2 or x.stride(1) != 1 or weight.shape != (x.shape[1],):
        raise ValueError(f"rms_norm: x must be [T, H] with a contiguous last dim and weight [H]; got "
                         f"x {tuple(x.shape)} strides {x.stride()}, weight {tuple(weight.shape)}")
    T, H = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if T:
        _rms_norm_kernel[(T,)](x, weight, out, H, x.stride(0), out.stride(0), eps,
                               BLOCK=triton.next_power_of_2(H), num_warps=4)
    return out


# ---------------------------------------------------------------------------------- rope

@triton.jit
def _rope_kernel(X_ptr, Cos_ptr, Sin_ptr, Out_ptr, heads, stride_xt, stride_xh, stride_ct, stride_st,
                 HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    in_d = d < HALF
    mask = (h < heads) & in_d
    dtype = Out_ptr.dtype.element_ty
    # the tables are fp32; eager casts them to the activation dtype before multiplying
    cos1 = tl.load(Cos_ptr + t * stride_ct + d, mask=in_d, other=0.0).to(dtype).to(tl.float32)
    cos2 = tl.load(Cos_ptr + t * stride_ct + HALF + d, mask=in_d, other=0.0).to(dtype).to(tl.float32)
    sin1 = tl.load(Sin_ptr + t * stride_st + d, mask=in_d, other=0.0).to(dtype).to(tl.float32)
    sin2 = tl.load(Sin_ptr + t * stride_st + HALF + d, mask=in_d, other=0.0).to(dtype).to(tl.float32)
    row = X_ptr + t * stride_xt + h * stride_xh
    x1 = tl.load(row + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF + d, mask=mask, other=0.0).to(tl.float32)
    # each product rounded, then the sum, as three eager bf16 ops round
    out1 = (x1 * cos1).to(dtype).to(tl.float32) + (-x2 * sin1).to(dtype).to(tl.float32)
    out2 = (x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)
    dst = Out_ptr + t * heads * 2 * HALF + h * 2 * HALF
    tl.store(dst + d, out1.to(dtype), mask=mask)
    tl.store(dst + HALF + d, out2.to(dtype), mask=mask)


def apply_rope_eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments and result as `apply_rope`): the model's own op."""
    return model.apply_rope(x, cos, sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """Rotate x by the half-split convention of HF Llama checkpoints.

    Args:
        x: [T, heads, D] bf16/fp16/fp32, last dim contiguous, D even.
        cos, sin: [T, 1, D] fp32 (views of the rope table are fine: last dim contiguous).
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        [T, heads, D] contiguous, in x's dtype.
    """
    _check_impl(impl, "apply_rope")
    if impl == "eager":
        return apply_rope_eager(x, cos, sin)
    T, heads, D = x.shape
    if x.stride(2) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1 or D % 2:
        raise ValueError(f"apply_rope: needs an even head dim and contiguous last dims; got x "
                         f"{tuple(x.shape)} strides {x.stride()}, cos strides {cos.stride()}")
    out = torch.empty((T, heads, D), dtype=x.dtype, device=x.device)
    if T:
        _rope_kernel[(T,)](x, cos, sin, out, heads, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
                           HALF=D // 2, BLOCK_H=triton.next_power_of_2(heads),
                           BLOCK_D=triton.next_power_of_2(D // 2), num_warps=4)
    return out


# ---------------------------------------------------------------------------------- SwiGLU

@triton.jit
def _silu_mul_kernel(G_ptr, U_ptr, Out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    dtype = Out_ptr.dtype.element_ty
    g = tl.load(G_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # eager rounds silu's output
    tl.store(Out_ptr + offs, (silu * u).to(dtype), mask=mask)


def silu_mul_eager(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "eager") -> torch.Tensor:
    """The eager twin (same arguments and result as `silu_mul`): the model's own op."""
    return model.silu_mul(gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """silu(gate) * up, elementwise.

    Args:
        gate, up: the same shape and dtype, contiguous.
        impl: "triton" (on CPU only under TRITON_INTERPRET=1) or "eager".

    Returns:
        a tensor of their shape and dtype.
    """
    _check_impl(impl, "silu_mul")
    if impl == "eager":
        return silu_mul_eager(gate, up)
    if gate.shape != up.shape or not (gate.is_contiguous() and up.is_contiguous()):
        raise ValueError(f"silu_mul: gate and up must be contiguous and of one shape; got "
                         f"{tuple(gate.shape)} and {tuple(up.shape)}")
    out = torch.empty_like(gate)
    N = gate.numel()
    if N:
        _silu_mul_kernel[(triton.cdiv(N, _SILU_BLOCK),)](gate, up, out, N, BLOCK=_SILU_BLOCK, num_warps=4)
    return out


def _check_impl(impl: str, name: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"{name}: impl must be one of {IMPLS}, got {impl!r}")


# One Triton kernel per op, forward only: the rollout engine's weight copy on CUDA.
INFERENCE_OPS = model.TrunkOps(rms_norm, apply_rope, silu_mul)
