"""What the kernel families share: constants, the ``impl`` switch, tile choice, argument checks and
the fp32-accumulating GEMMs their host code runs beside the kernels.

Constants come twice: as Python numbers for host code (``LOG2E``) and as ``tl.constexpr`` for
``@triton.jit`` bodies (``TL_LOG2E``), because a kernel reads a module global only in that form.
The checks raise ``ValueError`` naming the public function and the argument at fault; none of them
syncs with the host (a device-side fact is checked with ``torch._assert_async``).

An LM-head kernel takes its own casts (`autocast_operands`): under an enabled autocast it casts
hidden states and head weight to the autocast dtype itself, as autocast would cast a matmul's
operands, and computes with autocast off, so callers hand it fp32 masters or FSDP-gathered weights
alike. What this module does not hold: any kernel (only the grid dependency control functions kernels
call when launched with programmatic dependent launch), or anything one family alone uses.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import triton
import triton.language as tl

try:  # grid dependency control, for kernels launched with programmatic dependent launch (`pdl_available`)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without it: `pdl_available` is False, so no kernel calls these
    _TRITON_PDL = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass
else:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        _TRITON_PDL = False
    else:
        _TRITON_PDL = "launch_pdl" in CUDAOptions.__dataclass_fields__

# Labels of positions that predict nothing (prompt tokens, the final position): zero loss, zero gradient.
IGNORE_INDEX = -100
# The ``impl`` values of every public kernel function; the eager twin takes "eager" only.
IMPLS = ("triton", "eager")
# exp(x) = exp2(x * LOG2E): one ex2 instruction per exponential; LN2 converts base-2 logs back.
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# Stand-in for -inf in online-softmax states: exp2 of it is 0 and 0 * it is 0, never NaN.
NEG_BIG = -1.0e30

TL_IGNORE_INDEX = tl.constexpr(IGNORE_INDEX)
TL_LOG2E = tl.constexpr(LOG2E)
TL_LN2 = tl.constexpr(LN2)
TL_NEG_BIG = tl.constexpr(NEG_BIG)

# dtypes the Triton paths take; the CPU interpreter takes fp32 only (its low-precision dot is wrong)
TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

Tiles = TypeVar("Tiles")


def check_impl(name: str, impl: str) -> None:
    """``impl`` is one of IMPLS."""
    if impl not in IMPLS:
        raise ValueError(f"{name}: impl must be one of {IMPLS}, got {impl!r}")


def check_eager_impl(name: str, impl: str) -> None:
    """An eager twin is called with ``impl="eager"`` only."""
    if impl != "eager":
        raise ValueError(f"{name}: impl must be 'eager', got {impl!r}")


def tiles_for(device: torch.device, cuda: Tiles, interpret: Tiles) -> Tiles:
    """The tile sizes tuned for CUDA, or the interpreter's small ones on CPU."""
    return cuda if device.type == "cuda" else interpret


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s ``input_precision``: a true fp32 dot for fp32 operands (tf32 would cost ~1e-3
    relative error); bf16/fp16 operands ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def pdl_available(device: torch.device) -> bool:
    """Programmatic dependent launch works here: a CUDA device of compute capability 9 (Hopper) or
    later, and a Triton with the ``launch_pdl`` launch option and grid dependency control
    (``gdc_wait``). A kernel launched with it may start while the kernel before it finishes; it
    must wait (``gdc_wait``) before it reads that kernel's outputs or writes anything."""
    return _TRITON_PDL and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def pdl_launch(pdl: bool) -> dict[str, bool]:
    """The launch option of programmatic dependent launch, when asked for."""
    return {"launch_pdl": True} if pdl else {}


def check_pdl(name: str, pdl: bool, device: torch.device) -> None:
    """``pdl`` asked only where `pdl_available`."""
    if pdl and not pdl_available(device):
        raise ValueError(f"{name}: pdl=True needs a CUDA device of compute capability >= 9 and a Triton with "
                         f"launch_pdl; got {device}")


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (how many programs fill it)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def autocast_operands(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden, weight)`` as autocast would hand them to a matmul: both cast to the autocast dtype
    when autocast is on for their device, else unchanged (differentiable casts)."""
    device_type = hidden.device.type
    if not torch.is_autocast_enabled(device_type):
        return hidden, weight
    dtype = torch.get_autocast_dtype(device_type)
    return hidden.to(dtype), weight.to(dtype)


def check_lm_head_inputs(name: str, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> None:
    """hidden [T, H], weight [V, H] of one dtype, labels [T] int64 in [0, V) or IGNORE_INDEX (the
    range checked on the device, without a host sync)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"{name}: hidden must be [T, H] and weight [V, H]; got hidden "
                         f"{tuple(hidden.shape)} and weight {tuple(weight.shape)}")
    if labels.shape != (hidden.shape[0],) or labels.dtype != torch.int64:
        raise ValueError(f"{name}: labels must be [T] int64 with T = {hidden.shape[0]}; "
                         f"got {tuple(labels.shape)} {labels.dtype}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"{name}: hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    V = weight.shape[0]
    ok = ((labels >= 0) & (labels < V)) | (labels == IGNORE_INDEX)
    # An async device-side assert: a clear message, no host sync on GPU.
    torch._assert_async(ok.all(), f"{name}: labels must be in [0, {V}) or {IGNORE_INDEX}")


def check_triton_operands(name: str, *operands: torch.Tensor, others: tuple[torch.Tensor, ...] = ()) -> None:
    """What a Triton path needs of its floating ``operands``: one device (``others``' too), the
    last dimension contiguous, a dtype of TRITON_DTYPES, and fp32 on CPU (the interpreter)."""
    first = operands[0]
    devices = {t.device for t in operands + others}
    if len(devices) > 1:
        raise ValueError(f"{name}: all inputs must be on one device; got {sorted(str(d) for d in devices)}")
    if any(t.stride(-1) != 1 for t in operands):
        raise ValueError(f"{name}: the last dimension of every input must be contiguous")
    if first.dtype not in TRITON_DTYPES:
        raise ValueError(f"{name}(impl='triton') takes bf16, fp16 or fp32, got {first.dtype}")
    if first.device.type == "cpu" and first.dtype != torch.float32:
        raise ValueError(f"{name}(impl='triton') on CPU (TRITON_INTERPRET=1) needs fp32 inputs, got "
                         f"{first.dtype}; use impl='eager'")


def mm_fp32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b, out fp32, a and b fp32 or bf16/fp16 (fp32 accumulation)."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
        return
    try:
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    except RuntimeError:
        # torch builds without the out= form of the mixed-dtype GEMM: one temporary chunk.
        out.copy_(torch.mm(a, b, out_dtype=torch.float32))


def addmm_fp32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
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
