"""skinny_linear: the few-dozen-token tensor-core GEMM against its eager twin on fresh random inputs.

CPU: fp32 under TRITON_INTERPRET=1, small odd shapes (ragged K tiles, row blocks and splits, two
token tiles at T = 70). GPU: bf16, the same cases plus the Qwen2.5-0.5B projections at 16 and 64
tokens, with and without programmatic dependent launch.

Tolerances. Kernel and twin round at the same points (the output once from its fp32 sum; with
SwiGLU gate and up, silu, the product) and differ only in the order of the fp32 sums: per output
at most 8 fp32 eps of the sum of its terms' sizes (sum_k |x_k W_nk| + |b_n|). In bf16 a sum that
straddles a rounding boundary moves an output by one ulp: the bound adds one bf16 eps of the output
and the terms, and at most 2 % of the outputs (and 2 more) may differ at all from the product
rounded once from its fp32 value (a moved or missed rounding point changes about half). SwiGLU
carries the gate's and the up's bounds through silu(g) u (|silu'| < 1.1). A wrong row, column,
token, split or bias errs by order |y|.
"""

import pytest
import torch
import torch.nn.functional as F

from tolerances import activation_dtype as _dtype
from tolerances import assert_within as _assert_within
from tolerances import low_eps as _low_eps
from tolerances import rounded_once as _rounded_once

from oreal_fast.kernels import skinny_gemm
from oreal_fast.kernels.common import pdl_available
from oreal_fast.kernels.skinny_gemm import skinny_linear, skinny_linear_eager
from oreal_fast.kernels.trunk_inference import silu_mul_eager

EPS32 = torch.finfo(torch.float32).eps
pytestmark = pytest.mark.usefixtures("fp32_gemm_sums")  # the twin's GEMMs sum in fp32, as the kernel does


def _case(device, T, K, rows, has_bias, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = _dtype(device)
    x = torch.randn(T, K + 5, generator=g).to(device, dtype)[:, :K]  # strided rows
    weight = (torch.randn(rows, K, generator=g) / K**0.5).to(device, dtype)
    bias = torch.randn(rows, generator=g).to(device, dtype) if has_bias else None
    return x, weight, bias


def _terms(x, weight, bias):
    terms = x.float().abs() @ weight.float().abs().T
    return terms + bias.float().abs() if bias is not None else terms


def _assert_linear(x, weight, bias, got):
    assert got.is_contiguous()
    dtype = x.dtype
    ref = skinny_linear_eager(x, weight, bias)
    terms = _terms(x, weight, bias)
    _assert_within(got, ref, 8 * EPS32 * terms + _low_eps(dtype) * (ref.float().abs() + terms),
                   _rounded_once(x, weight, bias, dtype))


def _assert_swiglu(x, weight, bias, got):
    assert got.is_contiguous()
    dtype = x.dtype
    ref = skinny_linear_eager(x, weight, bias, swiglu=True)
    (wg, wu), (bg, bu) = weight.chunk(2), (bias.chunk(2) if bias is not None else (None, None))
    gate, up = F.linear(x, wg, bg), F.linear(x, wu, bu)
    tg, tu = _terms(x, wg, bg), _terms(x, wu, bu)
    bound_g = 8 * EPS32 * tg + _low_eps(dtype) * (gate.float().abs() + tg)
    bound_u = 8 * EPS32 * tu + _low_eps(dtype) * (up.float().abs() + tu)
    bound = (1.1 * up.float().abs() * bound_g + F.silu(gate.float()).abs() * bound_u
             + 2 * _low_eps(dtype) * ref.float().abs())
    _assert_within(got, ref, bound, silu_mul_eager(_rounded_once(x, wg, bg, dtype), _rounded_once(x, wu, bu, dtype)))


def _assert_partials(x, weight, bias, splits, got):
    ref = skinny_linear_eager(x, weight, bias, splits=splits)
    assert got.is_contiguous()
    block_k = skinny_gemm._tiles(x.device).block_k  # the K tile: a split holds whole tiles
    c = -(-(-(-x.shape[1] // splits)) // block_k) * block_k
    assert got.dtype == torch.float32 and got.shape == (-(-x.shape[1] // c), x.shape[0], weight.shape[0])
    assert ref.shape == got.shape
    terms = torch.stack([_terms(xs, ws, None) for xs, ws in zip(x.split(c, 1), weight.split(c, 1))])
    if bias is not None:
        terms[0] += bias.float().abs()
    _assert_within(got, ref, 8 * EPS32 * terms)
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert ((got.double().sum(0) - exact).abs() <= 8 * EPS32 * terms.sum(0)).all()


@pytest.mark.parametrize("T", [1, 5, 16, 37, 70])
@pytest.mark.parametrize("has_bias", [False, True], ids=["no_bias", "bias"])
def test_skinny_linear_matches_eager(device, T, has_bias):
    x, weight, bias = _case(device, T, 72, 37, has_bias, seed=T)  # ragged last K tile and row block
    _assert_linear(x, weight, bias, skinny_linear(x, weight, bias))


@pytest.mark.parametrize("T", [1, 5, 37, 70])
@pytest.mark.parametrize("has_bias", [False, True], ids=["no_bias", "bias"])
def test_skinny_linear_swiglu_matches_eager(device, T, has_bias):
    x, weight, bias = _case(device, T, 40, 2 * 21, has_bias, seed=100 + T)
    got = skinny_linear(x, weight, bias, swiglu=True)
    assert got.shape == (T, 21)
    _assert_swiglu(x, weight, bias, got)


@pytest.mark.parametrize("T", [1, 16, 37])
@pytest.mark.parametrize("K, splits", [(80, 3), (112, 2), (48, 3)])
@pytest.mark.parametrize("has_bias", [False, True], ids=["no_bias", "bias"])
def test_skinny_linear_partials_match_eager_and_sum_to_the_product(device, T, K, splits, has_bias):
    x, weight, bias = _case(device, T, K, 19, has_bias, seed=200 + T + K)
    _assert_partials(x, weight, bias, splits, skinny_linear(x, weight, bias, splits=splits))


def test_skinny_linear_rejects_bad_arguments(device):
    x, weight, bias = _case(device, 4, 32, 16, True, seed=1)
    with pytest.raises(ValueError, match="splits must be >= 1, and 1 with swiglu"):
        skinny_linear(x, weight, bias, swiglu=True, splits=2)
    with pytest.raises(ValueError, match="an even row count"):
        skinny_linear(x, weight[:15], bias[:15], swiglu=True)
    with pytest.raises(ValueError, match="must share one dtype"):
        skinny_linear(x.double(), weight, bias)
    with pytest.raises(ValueError, match=r"x must be \[T, K\]"):
        skinny_linear(x[:, :31], weight, bias)
    with pytest.raises(ValueError, match="bias must be"):
        skinny_linear(x, weight, bias[:8])


def test_skinny_linear_handles_no_tokens(device):
    x, weight, bias = _case(device, 0, 512, 16, True, seed=2)  # two splits of whole K tiles on CPU and GPU
    assert skinny_linear(x, weight, bias).shape == (0, 16)
    assert skinny_linear(x, weight, bias, splits=2).shape == (2, 0, 16)


QWEN_PROJECTIONS = {"qkv": (1152, 896, True, False, 1), "o": (896, 896, False, False, 2),
                    "gate_up": (9728, 896, False, True, 1), "down": (896, 4864, False, False, 3)}


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("T", [16, 64])
@pytest.mark.parametrize("projection", list(QWEN_PROJECTIONS))
def test_skinny_linear_qwen_shapes_bf16_on_gpu(poison_cuda_allocator, projection, T, pdl):
    if not torch.cuda.is_available():
        pytest.skip("the Qwen2.5-0.5B shapes in bf16 run on the GPU")
    if pdl and not pdl_available(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs compute capability >= 9")
    rows, K, has_bias, swiglu, splits = QWEN_PROJECTIONS[projection]
    x, weight, bias = _case("cuda", T, K, rows, has_bias, seed=300 + T)
    poison_cuda_allocator()  # an output the kernel leaves unwritten shows up as NaN
    got = skinny_linear(x, weight, bias, swiglu=swiglu, splits=splits, pdl=pdl)
    if swiglu:
        _assert_swiglu(x, weight, bias, got)
    elif splits > 1:
        _assert_partials(x, weight, bias, splits, got)
    else:
        _assert_linear(x, weight, bias, got)
