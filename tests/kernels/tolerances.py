"""Tolerances the few-token kernels' tests share (`test_decode_gemv.py`, `test_skinny_gemm.py`): a
kernel and its twin round at the same points and differ in the order of fp32 sums, so an output
may differ by its bound, and in bf16 only a few outputs may differ at all from the product rounded
once (each test module's docstring states its bounds)."""

import torch
import torch.nn.functional as F


def activation_dtype(device):
    """fp32 on CPU (the interpreter), bf16 on the GPU."""
    return torch.float32 if device == "cpu" else torch.bfloat16


def low_eps(dtype):
    """One ulp of the activation dtype, relative; 0 in fp32 (its roundings are the sums' own)."""
    return 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps


def assert_within(got, ref, bound, rounded_once=None, count_flips=True):
    """|got - ref| within bound; in bf16 (with count_flips) also few outputs unequal to
    `rounded_once` (default ref)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    err = (got.double() - ref.double()).abs()
    worst = int((err - bound.double()).flatten().argmax())
    assert (err <= bound.double()).all(), (f"worst at flat index {worst}: got {got.flatten()[worst].item()}, "
                                           f"twin {ref.flatten()[worst].item()}, bound {bound.flatten()[worst].item()}")
    if got.dtype != torch.float32 and count_flips:
        assert_few_differ(got, ref if rounded_once is None else rounded_once)


def assert_few_differ(got, ref, share=0.02):
    """Rounding flips are rare (about 1e-4 of the outputs): `share` of them and 2 more; a moved or
    missed rounding point changes about half."""
    differ = int((got != ref).sum())
    assert differ <= share * got.numel() + 2, f"{differ} of {got.numel()} outputs differ: more than flips explain"


def rounded_once(h, weight, bias, dtype):
    """F.linear(h, weight, bias) summed in fp32 and rounded once to dtype, bias included: the
    kernels' contract. The bf16 twin on the GPU may round the product before it adds the bias
    (cuBLAS's one-row path does: a third to a half of the outputs then differ by one ulp)."""
    return F.linear(h.float(), weight.float(), None if bias is None else bias.float()).to(dtype)
