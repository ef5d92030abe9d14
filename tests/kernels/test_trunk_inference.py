"""add_rms_norm, rope_write_kv, silu_mul: the rollout engine's Triton kernels against their eager
twins on fresh random inputs (a whole engine against the eager decoder: tests/rollout).

CPU: fp32 under TRITON_INTERPRET=1, small shapes. GPU: bf16 at the Qwen2.5-0.5B decode shapes.
Tolerances: rope rounds where the eager ops round, but the GPU compiler may contract a product
and the sum into one fused multiply-add (measured on an H200: 1-ulp differences in bf16), so each
output may differ from the twin by 2 eps (|x_i| + |x_partner|) (the sum of its two terms' sizes,
not its own: the terms can cancel); a wrong rotation, sign or position errs by order |x|. RMSNorm's fp32 sum and silu's exp and division round differently from torch's by a few fp32 units
in the last place (ulp): in fp32 the results may differ by that (bound: 16 ulp); in bf16 an
intermediate rounded one ulp apart (silu's output, the normalised row before the weight) and the
final rounding make at most two bf16 ulps. The residual sum and the values copied into the KV
pool have one rounding in both forms: equal bit for bit.
"""

import pytest
import torch

from oreal_fast.kernels import (add_rms_norm, add_rms_norm_eager, rope_write_kv, rope_write_kv_eager, silu_mul,
                                silu_mul_eager)
from oreal_fast.model.decoder import DecoderConfig, rope_table
from oreal_fast.model.decoder import rms_norm as eager_rms_norm


def _dtype(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def _ulps(got, ref):
    """Largest difference in units of the dtype's last place at the reference's magnitude."""
    eps = torch.finfo(ref.dtype).eps
    scale = ref.double().abs().clamp_min(torch.finfo(ref.dtype).tiny)
    return float(((got.double() - ref.double()).abs() / (scale * eps)).max())


def _max_ulps(dtype):
    return 16.0 if dtype == torch.float32 else 2.0


@pytest.mark.parametrize("T,H", [(1, 64), (7, 96), (256, 896)])
def test_add_rms_norm_matches_eager(device, T, H):
    g = torch.Generator().manual_seed(T + H)
    dtype = _dtype(device)
    x = (torch.randn(T, H, generator=g) * 3).to(device, dtype)
    residual = (torch.randn(T, H, generator=g) * 10).to(device, dtype)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(device, dtype)
    (normed, new_residual), (ref_normed, ref_residual) = (add_rms_norm(x, residual, w, 1e-6),
                                                          add_rms_norm_eager(x, residual, w, 1e-6))
    assert torch.equal(new_residual, ref_residual)  # the eager residual add
    assert torch.equal(new_residual, (residual.double() + x.double()).to(dtype))  # the exact sum, rounded once
    assert normed.dtype == dtype and normed.shape == (T, H)
    assert _ulps(normed, ref_normed) <= _max_ulps(dtype)


def test_add_rms_norm_without_a_residual_is_rms_norm_and_passes_x_on(device):
    dtype = _dtype(device)
    base = torch.randn(6, 160, device=device).to(dtype)
    x, w = base[:, :96], (1 + 0.1 * torch.randn(96, device=device)).to(dtype)  # strided rows
    normed, residual = add_rms_norm(x, None, w, 1e-6)
    assert residual is x
    assert _ulps(normed, eager_rms_norm(x, w, 1e-6)) <= _max_ulps(dtype)


def _rope_bound(x):
    """Per element 2 eps (|x1| + |x2|) of its pair: the fused multiply-add allowance above."""
    x1, x2 = x.float().chunk(2, dim=-1)
    terms = x1.abs() + x2.abs()
    return 2 * torch.finfo(x.dtype).eps * torch.cat((terms, terms), dim=-1)


@pytest.mark.parametrize("T,Hq,Hkv,D,block_size", [(1, 2, 1, 8, 1), (9, 14, 2, 64, 16), (33, 6, 3, 20, 5)])
def test_rope_write_kv_matches_eager(device, T, Hq, Hkv, D, block_size):
    """Random pools (slots the call does not name must keep their values), unique random slots."""
    cfg = DecoderConfig(family="qwen2", vocab_size=10, hidden_size=Hq * D, intermediate_size=8, num_layers=1,
                        num_heads=Hq, num_kv_heads=Hkv, head_dim=D, rope_theta=1e6)
    g = torch.Generator().manual_seed(T + Hq + D)
    dtype = _dtype(device)
    rope = rope_table(cfg, torch.device(device))
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g).to(device, dtype)
    positions = torch.randint(0, 20000, (T,), generator=g).to(device)
    num_blocks = T // block_size + 3
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T].to(device)
    pools = torch.randn(2, num_blocks, block_size, Hkv, D, generator=g).to(device, dtype)
    k_ref, v_ref = pools.clone()
    k_got, v_got = pools.clone()
    q_ref = rope_write_kv_eager(qkv, positions, rope, k_ref, v_ref, slots)
    q_got = rope_write_kv(qkv, positions, rope, k_got, v_got, slots)
    assert q_got.shape == (T, Hq, D) and q_got.dtype == dtype and q_got.is_contiguous()
    assert torch.equal(v_got, v_ref)  # copied, never rounded
    assert torch.equal(v_ref.view(-1, Hkv, D)[slots], qkv[:, (Hq + Hkv) * D :].view(T, Hkv, D))
    k_in = qkv[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D)
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=device)
    untouched[slots] = False
    assert torch.equal(k_got.view(-1, Hkv, D)[untouched], pools[0].view(-1, Hkv, D)[untouched])
    k_diff = (k_got.view(-1, Hkv, D)[slots].float() - k_ref.view(-1, Hkv, D)[slots].float()).abs()
    assert (k_diff <= _rope_bound(k_in)).all()
    assert ((q_got.float() - q_ref.float()).abs() <= _rope_bound(qkv[:, : Hq * D].view(T, Hq, D))).all()
    if device == "cpu":  # the interpreter does not contract: fp32 results equal bit for bit
        assert torch.equal(q_got, q_ref) and torch.equal(k_got, k_ref)


def test_rope_write_kv_rotates_by_position(device):
    """Against the rotation itself (not the twin): position p turns pair (x1, x2) of frequency f by
    angle p * f; position 0 leaves q and k as they are."""
    D, dtype = 8, _dtype(device)
    cfg = DecoderConfig(family="qwen2", vocab_size=10, hidden_size=D, intermediate_size=8, num_layers=1,
                        num_heads=1, num_kv_heads=1, head_dim=D, rope_theta=100.0)
    rope = rope_table(cfg, torch.device(device))
    qkv = torch.randn(2, 3 * D).to(device, dtype)
    positions = torch.tensor([0, 5], device=device)
    k_cache, v_cache = torch.zeros(2, 1, 2, 1, D, device=device, dtype=dtype)
    q = rope_write_kv(qkv, positions, rope, k_cache, v_cache, torch.tensor([1, 0], device=device))
    assert torch.equal(q[0, 0], qkv[0, :D]) and torch.equal(k_cache[0, 1, 0], qkv[0, D : 2 * D])
    assert torch.equal(v_cache[0, 0, 0], qkv[1, 2 * D :]) and torch.equal(v_cache[0, 1, 0], qkv[0, 2 * D :])
    angle = 5 * 100.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    x1, x2 = qkv[1, :D].double().cpu().chunk(2)
    expected = torch.cat((x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()))
    assert (q[1, 0].double().cpu() - expected).abs().max() <= 4 * torch.finfo(dtype).eps * expected.abs().max()


@pytest.mark.parametrize("shape", [(1, 5), (7, 300), (256, 4864)])
def test_silu_mul_matches_eager(device, shape):
    g = torch.Generator().manual_seed(shape[1])
    dtype = _dtype(device)
    gate = (torch.randn(shape, generator=g) * 4).to(device, dtype)
    up = torch.randn(shape, generator=g).to(device, dtype)
    assert _ulps(silu_mul(gate, up), silu_mul_eager(gate, up)) <= _max_ulps(dtype)


def test_silu_mul_of_the_halves_of_one_packed_row(device):
    """The engine's MLP passes the two halves of one gate|up GEMM output: strided rows."""
    g = torch.Generator().manual_seed(5)
    dtype = _dtype(device)
    gate_up = (torch.randn(9, 2 * 1300, generator=g) * 4).to(device, dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert _ulps(silu_mul(gate, up), silu_mul_eager(gate, up)) <= _max_ulps(dtype)


def test_empty_inputs(device):
    dtype = _dtype(device)
    assert silu_mul(torch.empty(0, 3, device=device, dtype=dtype), torch.empty(0, 3, device=device, dtype=dtype)
                    ).shape == (0, 3)
    normed, residual = add_rms_norm(*(torch.empty(0, 8, device=device, dtype=dtype) for _ in range(2)),
                                    torch.ones(8, device=device, dtype=dtype), 1e-6)
    assert normed.shape == residual.shape == (0, 8)
    none = torch.empty(0, dtype=torch.int64, device=device)
    pool = torch.zeros(2, 4, 1, 8, device=device, dtype=dtype)
    q = rope_write_kv(torch.empty(0, 24, device=device, dtype=dtype), none, torch.zeros(16, 2, 8, device=device),
                      pool, pool.clone(), none)
    assert q.shape == (0, 1, 8)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="impl must be one of"):
        add_rms_norm(torch.ones(2, 4), None, torch.ones(4), 1e-6, impl="cuda")
    with pytest.raises(ValueError, match=r"weight \[H\]"):
        add_rms_norm(torch.ones(2, 4), None, torch.ones(3), 1e-6)
    with pytest.raises(ValueError, match="one shape"):
        silu_mul(torch.ones(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        silu_mul(torch.ones(2, 3, 4), torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match=r"residual must be \[T, H\]"):
        add_rms_norm(torch.ones(2, 4), torch.ones(3, 4), torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="of x's dtype"):
        add_rms_norm(torch.ones(2, 4), None, torch.ones(4, dtype=torch.float64), 1e-6)
    pool, pos, rope = torch.zeros(3, 2, 1, 8), torch.zeros(2, dtype=torch.int64), torch.zeros(16, 2, 8)
    with pytest.raises(ValueError, match=r"qkv must be \[T, \(Hq \+ 2 Hkv\) D\]"):
        rope_write_kv(torch.ones(2, 16), pos, rope, pool, pool.clone(), pos)  # no room for a query head
    with pytest.raises(TypeError, match="KV pool holds"):
        rope_write_kv(torch.ones(2, 24, dtype=torch.float64), pos, rope, pool, pool.clone(), pos)
    with pytest.raises(ValueError, match="slots must be"):
        rope_write_kv(torch.ones(2, 24), pos, rope, pool, pool.clone(), pos.int())
    with pytest.raises(ValueError, match="rope must be"):
        rope_write_kv(torch.ones(2, 24), pos, rope[:, :, :4], pool, pool.clone(), pos)
    with pytest.raises(ValueError, match="pdl=True needs a CUDA device of compute capability >= 9"):
        rope_write_kv(torch.ones(2, 24), pos, rope, pool, pool.clone(), pos, pdl=True)
