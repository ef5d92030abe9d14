"""sample_from_logits: token-for-token parity with its eager twin, the official kept set, and the
official distribution, on both of the kernel's paths (the two-sweep bracket and the search
fallback; `_sample` reports which one each row took). sample_with_logprobs and token_logprobs:
the tokens' log-probs at temperature 1, unfiltered (sweep 1's log-sum-exp; the greedy kernel's
online one) against their twins and an fp64 log_softmax.

CPU: fp32 logits (and bf16 in one test) under TRITON_INTERPRET=1 at V = 37, 300 and 5000 (each
row cut into a few chunks). GPU (skipped without CUDA): bf16 logits at the Qwen2.5 vocabulary,
V = 151936, and a CUDA-graph capture. Rows are continuous random logits (no exact ties) unless a
test plants ties on purpose.
"""

import dataclasses
import importlib
import math

import pytest
import torch

from oreal_fast.kernels import (sample_from_logits, sample_from_logits_eager, sample_with_logprobs,
                                sample_with_logprobs_eager, token_logprobs, token_logprobs_eager)
from oreal_fast.rollout.base import SamplingParams
from oreal_fast.rollout.sampling import filter_logits

# The module itself, for its kept-set helper and the interpreter's chunk count.
smp = importlib.import_module("oreal_fast.kernels.sampling")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOP_KS = (0, 1, 5, "V")
TOP_PS = (1.0, 0.9, 0.5, 0.01)
TEMPERATURES = (0.7, 1.0, 1.3)
# Every top-k x top-p combination, each at one temperature (cycled), so that all three meet
# every filter without running the whole cross product in the interpreter.
CASES = [(TEMPERATURES[i % 3], k, p) for i, (k, p) in
         enumerate((k, p) for k in TOP_KS for p in TOP_PS)]
CASE_IDS = [f"T{t}-k{k}-p{p}" for t, k, p in CASES]
VOCABS = (37, 300, 5000)
ONE_MINUS_ULP = 1.0 - 2.0**-24  # the largest fp32 below 1


def _logits(B, V, device, seed, dtype=torch.float32, scale=2.0):
    """B rows of N(0, scale^2) logits; row 0 has one token ~ 30 above the rest (p ~ 1), row 1 is
    near-uniform (spread 1e-3)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(B, V, generator=g) * scale
    x[0, int(torch.randint(0, V, (1,), generator=g))] = 30.0
    x[1] = torch.randn(V, generator=g) * 1e-3
    u = torch.rand(B, generator=g)
    return x.to(device=device, dtype=dtype), u.to(device)


def _k(top_k, V):
    return V if top_k == "V" else top_k


def _assert_logprobs(got, x, tokens, atol=1e-5):
    """got [B] fp32 against log_softmax(x) at temperature 1 in fp64, at `tokens`."""
    ref = torch.log_softmax(x.double(), -1).gather(1, tokens[:, None])[:, 0]
    assert got.dtype == torch.float32 and got.shape == tokens.shape
    torch.testing.assert_close(got.double(), ref, atol=atol, rtol=0)


def _assert_same_tokens(got, ref, x, u):
    bad = (got != ref).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise AssertionError(f"{len(bad)} of {len(got)} rows differ; row {i}: kernel {int(got[i])}, "
                             f"eager {int(ref[i])}, uniform {float(u[i]):.9g}, "
                             f"logits max {float(x[i].max()):.4g} min {float(x[i].min()):.4g}")


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("temperature,top_k,top_p", CASES, ids=CASE_IDS)
def test_matches_eager_token_for_token(V, temperature, top_k, top_p, device):
    x, u = _logits(4, V, device, seed=V)
    kw = dict(temperature=temperature, top_k=_k(top_k, V), top_p=top_p)
    _assert_same_tokens(sample_from_logits(x, u, **kw), sample_from_logits_eager(x, u, **kw), x, u)


@pytest.mark.parametrize("temperature,top_k,top_p", CASES, ids=CASE_IDS)
def test_kept_set_is_the_official_filter(temperature, top_k, top_p):
    """kept_mask_eager (which the twin samples from) against filter_logits' finite entries."""
    V = 300
    x, _ = _logits(16, V, "cpu", seed=1)
    params = SamplingParams(max_new_tokens=1, max_length=2, temperature=temperature,
                            top_k=_k(top_k, V), top_p=top_p)
    official = torch.isfinite(filter_logits(x, params))
    kept = smp.kept_mask_eager(x, temperature=temperature, top_k=_k(top_k, V), top_p=top_p)
    assert torch.equal(kept, official), f"rows differ: {(kept != official).any(-1).nonzero().flatten().tolist()}"


@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize("temperature,top_k,top_p", CASES, ids=CASE_IDS)
def test_extreme_uniforms_give_first_and_last_kept_token(temperature, top_k, top_p, impl, device):
    """u = 0 gives the first kept index, u = 1 - 2^-24 the last (the fp32 round-off guard), on
    rows where every kept token holds more than 2^-24 of the kept mass."""
    V = 300
    x, _ = _logits(4, V, device, seed=2, scale=1.0)
    x = x[2:]  # not the planted p ~ 1 row, whose other tokens hold ~1e-19 each
    kw = dict(temperature=temperature, top_k=_k(top_k, V), top_p=top_p)
    kept = smp.kept_mask_eager(x, **kw)
    idx = torch.arange(V, device=device)
    first = torch.where(kept, idx, V).amin(-1)
    last = torch.where(kept, idx, -1).amax(-1)
    zeros = torch.zeros(2, device=device)
    assert torch.equal(sample_from_logits(x, zeros, impl=impl, **kw), first)
    assert torch.equal(sample_from_logits(x, zeros + ONE_MINUS_ULP, impl=impl, **kw), last)


def _next_pow2(n):
    return 1 << (n - 1).bit_length()


def _paths_config(path, device, V):
    """The kernel's config for V with the bracket wide (every row takes the two sweeps), placed
    wrong (a negative budget puts it above the threshold: the check fails) or overflowing a
    16-slot buffer (every row falls back)."""
    cfg = smp._config(torch.device(device), V)
    if path == "wide":  # (on CUDA the default buffer holds V = 300: no kernel to compile again)
        return dataclasses.replace(cfg, budget=2 * V, cap=max(cfg.cap, _next_pow2(V)))
    if path == "miss":
        return dataclasses.replace(cfg, budget=-V)
    return dataclasses.replace(cfg, budget=2 * V, cap=16)


@pytest.mark.parametrize("path", ["wide", "miss", "overflow"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.9), (0.7, 5, 0.9), (1.3, 5, 1.0),
                                                     (1.0, 0, 0.5)])
def test_both_paths_match_eager(path, temperature, top_k, top_p, device):
    """The bracket path and the fallback give the eager twin's tokens; `resolved` says which ran."""
    V = 300
    x, u = _logits(6, V, device, seed=11)
    tokens, resolved, logprobs = smp._sample(x, u, temperature, top_k, top_p, _paths_config(path, device, V),
                                             logprobs=True)
    _assert_same_tokens(tokens, sample_from_logits_eager(x, u, temperature=temperature, top_k=top_k,
                                                         top_p=top_p), x, u)
    want = 1 if path == "wide" else 0
    assert resolved.tolist() == [want] * 6, f"{path}: rows resolved by the two sweeps {resolved.tolist()}"
    _assert_logprobs(logprobs, x, tokens)


def test_bracket_of_a_few_percent_resolves_ordinary_rows(device):
    """The estimate is good enough that a bracket of V / 40 tokens a side (CUDA's is V / 76)
    holds the threshold on ordinary rows, the planted one-token row included. (The planted
    near-uniform row, all logits within 1e-3, fits in one histogram bin: it may fall back.)"""
    V = 5000
    x, u = _logits(8, V, device, seed=12)
    cfg = smp._config(torch.device(device), V)
    cfg = dataclasses.replace(cfg, budget=V // 40, cap=max(cfg.cap, 512))
    for top_k, top_p in [(0, 0.9), (20, 0.9), (50, 1.0), (0, 0.5)]:
        tokens, resolved, _ = smp._sample(x, u, 1.0, top_k, top_p, cfg)
        resolved[1] = 1
        assert resolved.all(), f"top_k {top_k} top_p {top_p}: fallback on rows {(resolved == 0).nonzero().flatten().tolist()}"
        _assert_same_tokens(tokens, sample_from_logits_eager(x, u, top_k=top_k, top_p=top_p), x, u)


def test_bf16_rows_with_ties(device):
    """bf16 logits (many exact ties at every threshold): the tie count and order are the official ones."""
    V = 3000
    x, u = _logits(6, V, device, seed=13, dtype=torch.bfloat16, scale=3.0)
    for top_k, top_p in [(0, 0.9), (20, 0.9), (0, 0.3)]:
        kw = dict(top_k=top_k, top_p=top_p)
        _assert_same_tokens(sample_from_logits(x, u, **kw), sample_from_logits_eager(x, u, **kw), x, u)


def _chi_square_p_value(counts, probs):
    """P(chi2_df >= statistic), df = cells - 1, by the regularised upper incomplete gamma."""
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))


def test_distribution_matches_official_probabilities(device, monkeypatch):
    """Frequencies of N draws against filter_logits(...).softmax(-1), chi-square at alpha 1e-3."""
    monkeypatch.setattr(smp, "_INTERPRET_CHUNKS", 1)  # one chunk: fewer interpreted steps per draw
    N = 100 if device == "cpu" else 2**16
    probs_planted = torch.tensor([0.02, 0.3, 0.005, 0.15, 0.06, 0.2, 0.01, 0.1, 0.08, 0.03,
                                  0.015, 0.03])
    x = probs_planted.log().repeat(N, 1).to(device)  # (N, 12)
    params = SamplingParams(max_new_tokens=1, max_length=2, top_k=8, top_p=0.85)
    # top-k 8 keeps mass 0.95 (both 0.03 included); renormalised, 0.3 + 0.2 + 0.15 + 0.1 is
    # 0.79 < 0.85 and adding 0.08 reaches 0.87: top-p keeps indices 1, 3, 5, 7, 8.
    probs = filter_logits(x[:1].cpu(), params).softmax(-1)[0].double()
    kept = probs > 0
    assert kept.nonzero().flatten().tolist() == [1, 3, 5, 7, 8]
    assert (probs[kept] * N).min() >= 5, "chi-square needs >= 5 expected draws per cell"
    g = torch.Generator(device=device).manual_seed(0)
    u = torch.rand(N, generator=g, device=device)
    # 2^13 rows a call: on CUDA the kernel's per-row buffers (64 KiB a row) stay at 512 MiB
    tokens = torch.cat([sample_from_logits(x[i:i + 2**13], u[i:i + 2**13], top_k=params.top_k,
                                           top_p=params.top_p) for i in range(0, N, 2**13)]).cpu()
    assert kept[tokens].all(), f"tokens outside the kept set: {sorted(set(tokens[~kept[tokens]].tolist()))}"
    counts = torch.bincount(tokens, minlength=12).double()[kept]
    assert _chi_square_p_value(counts, probs[kept]) > 1e-3


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_ties_at_the_top_p_threshold_keep_the_official_number(impl, device):
    """Four tokens tied at the threshold: keep as many as the official rule, lowest index first."""
    # Weights 8 (index 5) and 1 (indices 1, 3, 6, 9), the rest ~0: total 12 + tiny. top_p 0.8
    # needs 9.6: the 8 and then 2 of the tied ones (8 + 1 < 9.6 <= 8 + 2).
    x = torch.full((2, 12), -40.0)
    x[:, 5] = math.log(8.0)
    x[:, [1, 3, 6, 9]] = 0.0
    x = x.to(device)
    params = SamplingParams(max_new_tokens=1, max_length=2, top_p=0.8)
    official = torch.isfinite(filter_logits(x.cpu(), params))
    assert official.sum(-1).tolist() == [3, 3]  # torch.sort decides which tied tokens
    kept = smp.kept_mask_eager(x, top_p=0.8)
    assert kept.cpu()[0].nonzero().flatten().tolist() == [1, 3, 5]
    u = torch.tensor([0.0, ONE_MINUS_ULP], device=device)
    assert sample_from_logits(x, u, top_p=0.8, impl=impl).tolist() == [1, 5]
    # 1/10 of the kept mass is token 1, the next 1/10 token 3, then 8/10 token 5.
    u = torch.tensor([0.09, 0.11], device=device)
    assert sample_from_logits(x, u, top_p=0.8, impl=impl).tolist() == [1, 3]


@pytest.mark.parametrize("impl", ["triton", "eager"])
def test_top_k_keeps_every_tie_with_the_kth(impl, device):
    x = torch.tensor([[0.5, 2.0, 1.0, 1.0, -3.0, 1.0, 0.2]]).repeat(2, 1).to(device)
    params = SamplingParams(max_new_tokens=1, max_length=2, top_k=2)
    assert torch.isfinite(filter_logits(x.cpu(), params))[0].nonzero().flatten().tolist() == [1, 2, 3, 5]
    u = torch.tensor([0.0, ONE_MINUS_ULP], device=device)
    assert sample_from_logits(x, u, top_k=2, impl=impl).tolist() == [1, 5]


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (5, 0.9), (0, 0.9)])
def test_masked_vocabulary_rows(top_k, top_p, device):
    """-inf and -1e30 entries (a masked vocabulary) stretch the value range to ~1e30: the search
    still ends exactly, and never returns a masked token."""
    V = 300
    x, u = _logits(6, V, device, seed=3)
    g = torch.Generator(device="cpu").manual_seed(4)
    masked = (torch.rand(6, V, generator=g) < 0.6).to(device)
    x = x.masked_fill(masked, -1e30)
    x[:, ::7] = float("-inf")
    kw = dict(top_k=top_k, top_p=top_p)
    got = sample_from_logits(x, u, **kw)
    _assert_same_tokens(got, sample_from_logits_eager(x, u, **kw), x, u)
    assert torch.isfinite(x.gather(1, got[:, None])).all() and (x.gather(1, got[:, None]) > -1e29).all()


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9), (1.3, 0, 0.5), (1.0, 1, 0.9)],
                         ids=["T1", "T0.7-k5-p0.9", "T1.3-p0.5", "T1-k1-p0.9"])
def test_logprobs_are_the_unfiltered_distributions(V, temperature, top_k, top_p, device):
    """sample_with_logprobs: the tokens of sample_from_logits and log_softmax(x)[token] at
    temperature 1 (not the tempered or filtered distribution), as its twin; rows with -inf
    entries and a planted row (one token ~30 above the rest) included."""
    x, u = _logits(5, V, device, seed=20 + V)
    x[3, ::4] = float("-inf")
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens, logprobs = sample_with_logprobs(x, u, **kw)
    eager_tokens, eager_logprobs = sample_with_logprobs_eager(x, u, **kw)
    _assert_same_tokens(tokens, sample_from_logits(x, u, **kw), x, u)
    _assert_same_tokens(tokens, eager_tokens, x, u)
    _assert_logprobs(logprobs, x, tokens)
    _assert_logprobs(eager_logprobs, x, tokens)


@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_match_an_fp64_log_softmax(impl, V, dtype, device):
    """Given tokens (greedy's argmax and arbitrary ones), -inf entries in a row included."""
    x, _ = _logits(6, V, device, seed=30 + V, dtype=dtype)
    x[3, 1::3] = float("-inf")
    g = torch.Generator(device="cpu").manual_seed(V)
    tokens = torch.randint(0, V, (6,), generator=g).to(device)
    tokens[3] = 0  # a finite entry of the masked row
    tokens[:2] = x[:2].argmax(-1)
    _assert_logprobs(token_logprobs(x, tokens, impl=impl), x, tokens)


def test_token_logprobs_outside_the_vocabulary_is_nan_not_a_read_past_the_row(device):
    x, _ = _logits(3, 37, device, seed=5)
    out = token_logprobs(x, torch.tensor([3, 37, -1], device=device))
    assert torch.isfinite(out[0]) and out[1:].isnan().all()
    assert token_logprobs(x[:0], torch.zeros(0, dtype=torch.int64, device=device)).shape == (0,)


@pytest.mark.parametrize("impl", ["triton", "eager"])
@pytest.mark.parametrize(
    "logits,tokens,match",
    [(torch.zeros(3), torch.zeros(3, dtype=torch.int64), "logits must be \\[B, V\\]"),
     (torch.zeros(3, 5, dtype=torch.float64), torch.zeros(3, dtype=torch.int64), "logits must be bf16, fp16 or fp32"),
     (torch.zeros(3, 5), torch.zeros(3, dtype=torch.int32), "tokens must be \\[B\\] int64"),
     (torch.zeros(3, 5), torch.zeros(2, dtype=torch.int64), "tokens must be \\[B\\] int64")],
    ids=["logits_dim", "logits_dtype", "tokens_dtype", "tokens_shape"])
def test_token_logprobs_bad_arguments_name_the_fault(impl, logits, tokens, match):
    with pytest.raises(ValueError, match=f"token_logprobs.*{match}"):
        token_logprobs(logits, tokens, impl=impl)


def test_empty_batch(device):
    out = sample_from_logits(torch.zeros(0, 50, device=device), torch.zeros(0, device=device), top_p=0.9)
    assert out.shape == (0,) and out.dtype == torch.int64


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(logits=lambda x: x[0]), "logits must be \\[B, V\\]"),
        (dict(logits=lambda x: x.double()), "logits must be bf16, fp16 or fp32"),
        (dict(uniform=lambda u: u.double()), "uniform must be \\[B\\] fp32"),
        (dict(uniform=lambda u: u[:-1]), "uniform must be \\[B\\] fp32"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(top_k=-1), "top_k must be an int >= 0"),
        (dict(top_p=0.0), "top_p must be in \\(0, 1\\]"),
        (dict(top_p=1.5), "top_p must be in \\(0, 1\\]"),
        (dict(impl="cuda"), "impl must be one of"),
    ],
    ids=["logits_dim", "logits_dtype", "uniform_dtype", "uniform_shape", "temperature", "top_k",
         "top_p_zero", "top_p_big", "impl"],
)
def test_bad_arguments_name_the_fault(change, match):
    args = dict(logits=torch.zeros(3, 10), uniform=torch.zeros(3))
    kwargs = {}
    for key, value in change.items():
        if key in args:
            args[key] = value(args[key])
        else:
            kwargs[key] = value
    with pytest.raises(ValueError, match=match):
        sample_from_logits(args["logits"], args["uniform"], **kwargs)


def test_non_contiguous_vocabulary_is_refused(device):
    x = torch.zeros(10, 3, device=device).t()
    with pytest.raises(ValueError, match="last dimension of logits must be contiguous"):
        sample_from_logits(x, torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="sample_with_logprobs: the last dimension of logits must be contiguous"):
        sample_with_logprobs(x, torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="token_logprobs: the last dimension of logits must be contiguous"):
        token_logprobs(x, torch.zeros(3, dtype=torch.int64, device=device))


QWEN_V = 151936


@needs_cuda
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.9), (0.7, 20, 0.9), (1.0, 0, 1.0),
                                                     (1.3, 50, 1.0), (1.0, 0, 0.5)])
def test_bf16_qwen_vocabulary(temperature, top_k, top_p, poison_cuda_allocator):
    """bf16 at V = 151936, LLM-like spread (N(0, 3^2) logits, ~10^2-10^3 tokens kept at top-p
    0.9) and many exact bf16 ties: the kernel equals the twin on all but fp32 round-off rows."""
    B = 256
    x, u = _logits(B, QWEN_V, "cuda", seed=5, dtype=torch.bfloat16, scale=3.0)
    poison_cuda_allocator()
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    got = sample_from_logits(x, u, **kw)
    ref = sample_from_logits_eager(x, u, **kw)
    assert smp.kept_mask_eager(x, **kw).gather(1, got[:, None]).all(), "a token outside the kept set"
    # A row may differ only where u * mass or the top-p mass falls within fp32 round-off of a
    # boundary: the kernel's fp32 sums over 151936 terms carry ~1e-6 relative error, against
    # token masses of 1e-5-1e-3 here, so about 1 % of rows (measured on an H200: 0-3 of 256).
    # A wrong kernel differs on most rows.
    assert int((got != ref).sum()) <= 8, f"rows differ: {(got != ref).nonzero().flatten().tolist()}"


@needs_cuda
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.9), (0.7, 20, 0.9), (1.0, 0, 1.0)])
def test_bf16_qwen_vocabulary_logprobs(temperature, top_k, top_p, poison_cuda_allocator):
    """bf16 at V = 151936: the fused log-probs (sampled) and token_logprobs (greedy's argmax)
    against an fp64 log_softmax: fp32 sums of 151936 terms, ~1e-6 relative."""
    x, u = _logits(256, QWEN_V, "cuda", seed=9, dtype=torch.bfloat16, scale=3.0)
    poison_cuda_allocator()
    tokens, logprobs = sample_with_logprobs(x, u, temperature=temperature, top_k=top_k, top_p=top_p)
    _assert_logprobs(logprobs, x, tokens, atol=1e-4)
    greedy = x.argmax(-1)
    _assert_logprobs(token_logprobs(x, greedy), x, greedy, atol=1e-4)


@needs_cuda
def test_bf16_qwen_vocabulary_distribution():
    """One bf16 row drawn 2^18 times: chi-square on the tokens of expected count >= 20 and one
    pooled cell for the rest of the kept set, at alpha 1e-3."""
    N = 2**18
    x, _ = _logits(3, QWEN_V, "cuda", seed=6, dtype=torch.bfloat16, scale=3.0)
    x = x[2:3]  # a plain row (rows 0 and 1 are the planted ones)
    kw = dict(top_p=0.9)
    w = smp._kept_weights(x.float(), 1.0, 0, 0.9)[0]
    probs = (w / w.sum()).cpu()
    g = torch.Generator(device="cuda").manual_seed(1)
    u = torch.rand(N, generator=g, device="cuda")
    # 2^13 rows a call: the kernel's per-row buffers (64 KiB a row) stay at 512 MiB
    tokens = torch.cat([sample_from_logits(x.expand(2**13, -1), u[i:i + 2**13], **kw)
                        for i in range(0, N, 2**13)]).cpu()
    assert (probs[tokens] > 0).all(), "a token outside the kept set"
    counts = torch.bincount(tokens, minlength=QWEN_V).double()
    big = probs * N >= 20
    cells = torch.cat([counts[big], counts[~big].sum()[None]])
    cell_probs = torch.cat([probs[big], probs[~big].sum()[None]])
    assert big.sum() >= 20
    assert _chi_square_p_value(cells, cell_probs) > 1e-3


@needs_cuda
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.9), (0.7, 20, 0.9), (1.0, 0, 1.0)])
def test_bf16_qwen_vocabulary_takes_two_sweeps(temperature, top_k, top_p):
    """On LLM-like bf16 rows (and the planted one-token row) the default bracket holds every
    threshold. (The planted near-uniform row, all logits within 1e-3, fits in one histogram bin:
    it may fall back.)"""
    x, u = _logits(256, QWEN_V, "cuda", seed=7, dtype=torch.bfloat16, scale=3.0)
    tokens, resolved, _ = smp._sample(x, u, temperature, top_k, top_p, smp._config(x.device, QWEN_V))
    resolved[1] = 1
    assert resolved.all(), f"fallback on rows {(resolved == 0).nonzero().flatten().tolist()}"
    assert smp.kept_mask_eager(x, temperature=temperature, top_k=top_k,
                               top_p=top_p).gather(1, tokens[:, None]).all()


@needs_cuda
def test_cuda_graph_replay_reads_inputs_on_device():
    """Captured on other logits and uniforms, replayed after the real ones are copied in: the
    tokens follow what the tensors hold at replay (no host sync, no shape read from data)."""
    x, u = _logits(64, QWEN_V, "cuda", seed=8, dtype=torch.bfloat16, scale=3.0)
    x_static, u_static = torch.randn_like(x), torch.rand_like(u)
    kw = dict(temperature=0.8, top_k=0, top_p=0.9)
    sample_from_logits(x_static, u_static, **kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = sample_from_logits(x_static, u_static, **kw)
    x_static.copy_(x)
    u_static.copy_(u)
    graph.replay()
    torch.cuda.synchronize()
    ref = sample_from_logits_eager(x, u, **kw)
    assert int((tokens != ref).sum()) <= 2, f"rows differ: {(tokens != ref).nonzero().flatten().tolist()}"
