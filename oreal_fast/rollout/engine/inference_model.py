"""The rollout engine's copy of the actor: the Llama/Qwen2 decoder of `oreal_fast.model.decoder`,
laid out for generation with few kernels per layer.

Per layer, q/k/v are one matrix `attn.qkv` [(Hq + 2 Hkv) D, H] (with one bias) and gate/up one
matrix `mlp.gate_up` [2 I, H]; `load_weights` packs the Decoder's state-dict tensors into them in
place. The residual add is fused into the RMSNorm after it, rope into the KV-cache write, SwiGLU
reads the packed gate|up output (`oreal_fast.kernels.trunk_inference`). A layer is then:

    h, r = add_rms_norm(x, r, attn_norm)           # r: the residual stream; layer 0 has none to add
    qkv  = h @ Wqkv.T + bqkv                       # one GEMM, the bias in its epilogue (addmm)
    o    = cache.attend(layer, qkv, positions, rope)  # rope q, k; write k, v; attend
    x    = o @ Wo.T
    h, r = add_rms_norm(x, r, mlp_norm)
    g, u = (h @ Wgate_up.T).chunk(2)               # one GEMM, two views
    x    = silu_mul(g, u) @ Wdown.T

and the model ends with `add_rms_norm(x, r, norm)` and the caller's head. The attention cache
(`PagedCache`, built by the model runner per forward) owns the KV pool, the slots and the
attention kernel; this module sees the pool only to hand one layer's to the few-token path's
q|k|v kernel (below).

Few tokens (T <= `gemv_max_tokens`, Triton only): a forward that small is bound by its kernel
count, not its bytes, so the layer runs as skinny GEMMs with the norms, rope with the K/V write,
and SwiGLU fused in (`oreal_fast.kernels.decode_gemv`): 4 kernels besides the attention kernel,
where the layer above runs 8 to 10 (rope_write_kv among them; cuBLAS adds split-K reductions at
small T):

    q, r = norm_linear_rope_kv(x, r, attn_norm, Wqkv, bqkv,   # x: the last down's fp32 partial sums;
                               positions, rope, *cache.kv_pool(layer))   # k roped and v into the pool
    o    = cache.attend_roped(layer, q)
    x    = linear_partials(o, Wo)                         # [S, T, H] fp32, added by the next prologue
    a, r = norm_linear(x, r, mlp_norm, Wgate_up, swiglu=True)   # silu(g) * u in the epilogue
    x    = linear_partials(a, Wdown)

ending with `add_rms_norm_partials(x, r, norm)`. The caller sets the threshold (the engine's
`EngineConfig.gemv_max_tokens`, 1: on an H100 the path wins at one token and loses from four,
benchmarks/test_bench_decode_gemv.py).

A few dozen tokens (`gemv_max_tokens` < T <= `skinny_max_tokens`, Triton only): the GEMV layers'
CUDA-core products re-read the activations per program, so past a few tokens the layer runs as
tensor-core skinny GEMMs (`oreal_fast.kernels.skinny_gemm`) with SwiGLU in the gate|up epilogue
and the o and down projections as fp32 partial sums that the next norm adds: 7 kernels besides
the attention, where the cuBLAS layer above runs 8 to 10 (a decode step at 16 rows: 202 kernels,
not 250):

    h, r = add_rms_norm_partials(x, r, attn_norm)         # x: the last down's partials
    qkv  = skinny_linear(h, Wqkv, bqkv)
    o    = cache.attend(layer, qkv, positions, rope)
    x    = skinny_linear(o, Wo, splits=O_SPLITS)           # [S, T, H] fp32
    h, r = add_rms_norm_partials(x, r, mlp_norm)
    a    = skinny_linear(h, Wgate_up, swiglu=True)
    x    = skinny_linear(a, Wdown, splits=DOWN_SPLITS)

ending as the GEMV path ends. A decode CUDA graph's batch bucket fixes its T, so each graph takes
one path. With `gemv_pdl` the GEMV path's kernels launch with programmatic dependent launch (Hopper
and later): each loads its weights while the kernel before it finishes (the model runner launches
the decode attention between them the same way). The skinny path's kernels stream their weights
after the wait, so launched that way they only hold multiprocessors early: plain launches there.

Not here: training (no autograd; the trained model is the Decoder), the KV pool and attention
(`model_runner`), sampling. Kernels run as Triton on CUDA (`impl="triton"`) and as their eager
twins elsewhere.
Invariants: the same weights give the Decoder's numbers: every op rounds where the Decoder's op
rounds (only the matmuls' shapes and sum orders differ, one GEMM where the Decoder runs three or
two, fp32 partial sums added before the one rounding on the few-token paths). Weights
are only ever written in place (captured CUDA graphs hold their addresses).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
import torch.nn as nn

from oreal_fast.kernels.decode_gemv import add_rms_norm_partials, linear_partials, norm_linear, norm_linear_rope_kv
from oreal_fast.kernels.skinny_gemm import skinny_linear
from oreal_fast.kernels.trunk_inference import add_rms_norm, silu_mul
from oreal_fast.model.decoder import DecoderConfig, Head, rope_table

# K splits of the skinny path's o and down projections: enough programs to fill an H100 at the
# Qwen2.5-0.5B shape (112 and 168 programs of 16 rows; benchmarks/test_bench_skinny_gemm.py)
O_SPLITS, DOWN_SPLITS = 2, 3


class PagedCache(Protocol):
    """What the model hands each layer's attention to: one forward's view of the KV pool."""

    def attend(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """Rope q and k, store k and v for `layer`, attend the queries over their sequences' cache.

        qkv: [T, (Hq + 2 Hkv) D] un-roped; positions: [T] int64; rope: [P, 2, D] fp32 -> out [T, Hq, D].
        """
        ...

    def kv_pool(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`layer`'s k and v pools [num_blocks, block_size, Hkv, D] and the tokens' slots [T] int64
        in them, for a kernel that ropes and stores k and v itself (then `attend_roped`)."""
        ...

    def attend_roped(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """`attend` once the caller has stored this forward's roped k and v at `kv_pool`'s slots:
        q [T, Hq, D] roped -> out [T, Hq, D]."""
        ...


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int, **factory) -> None:
        super().__init__()
        H, D = config.hidden_size, config.head_dim
        self.layer = layer
        self.qkv = nn.Linear(H, (config.num_heads + 2 * config.num_kv_heads) * D, bias=config.qkv_bias, **factory)
        self.o = nn.Linear(config.num_heads * D, H, bias=config.out_bias, **factory)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor,
                cache: PagedCache) -> torch.Tensor:
        out = cache.attend(self.layer, self.qkv(x), positions, rope)  # (T, Hq, D)
        return self.o(out.flatten(1))


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig, impl: str, **factory) -> None:
        super().__init__()
        H, I = config.hidden_size, config.intermediate_size
        self.impl = impl
        self.gate_up = nn.Linear(H, 2 * I, bias=False, **factory)
        self.down = nn.Linear(I, H, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (T, I) each: views of one GEMM output
        return self.down(silu_mul(gate, up, impl=self.impl))


class Layer(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int, impl: str, **factory) -> None:
        super().__init__()
        self.eps, self.impl = config.rms_norm_eps, impl
        self.attn_norm = nn.Parameter(torch.empty(config.hidden_size, **factory))
        self.attn = Attention(config, layer, **factory)
        self.mlp_norm = nn.Parameter(torch.empty(config.hidden_size, **factory))
        self.mlp = MLP(config, impl, **factory)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, rope: torch.Tensor,
                cache: PagedCache) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output, not yet added to `residual` -> (this MLP's output, residual)."""
        h, residual = add_rms_norm(x, residual, self.attn_norm, self.eps, impl=self.impl)
        x = self.attn(h, positions, rope, cache)
        h, residual = add_rms_norm(x, residual, self.mlp_norm, self.eps, impl=self.impl)
        return self.mlp(h), residual

    def forward_gemv(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                     rope: torch.Tensor, cache: PagedCache, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` as few-token Triton GEMVs: x [T, H] or [S, T, H] fp32 partial sums of the
        previous sublayer's output -> (this MLP's output as [S', T, H] fp32 partial sums, residual);
        `pdl`: launch them with programmatic dependent launch."""
        attn, mlp = self.attn, self.mlp
        k_cache, v_cache, slots = cache.kv_pool(attn.layer)
        q, residual = norm_linear_rope_kv(x, residual, self.attn_norm, self.eps, attn.qkv.weight, attn.qkv.bias,
                                          positions, rope, k_cache, v_cache, slots, pdl=pdl)  # (T, Hq, D)
        out = cache.attend_roped(attn.layer, q)  # (T, Hq, D)
        x = linear_partials(out.flatten(1), attn.o.weight, attn.o.bias, pdl=pdl)  # (S, T, H) fp32
        act, residual = norm_linear(x, residual, self.mlp_norm, self.eps, mlp.gate_up.weight, mlp.gate_up.bias,
                                    swiglu=True, pdl=pdl)  # (T, I)
        return linear_partials(act, mlp.down.weight, pdl=pdl), residual

    def forward_skinny(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                       rope: torch.Tensor, cache: PagedCache) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` as tensor-core skinny GEMMs, launched plainly (module docstring), with the same
        inputs and outputs as `forward_gemv`."""
        attn, mlp = self.attn, self.mlp
        h, residual = add_rms_norm_partials(x, residual, self.attn_norm, self.eps)
        out = cache.attend(attn.layer, skinny_linear(h, attn.qkv.weight, attn.qkv.bias), positions, rope)
        x = skinny_linear(out.flatten(1), attn.o.weight, attn.o.bias, splits=O_SPLITS)  # (S, T, H) fp32
        h, residual = add_rms_norm_partials(x, residual, self.mlp_norm, self.eps)
        act = skinny_linear(h, mlp.gate_up.weight, mlp.gate_up.bias, swiglu=True)  # (T, I)
        return skinny_linear(act, mlp.down.weight, splits=DOWN_SPLITS), residual


class InferenceModel(nn.Module):
    """The decoder for generation: embed -> layers -> final norm -> head, over one packed batch.

    Args:
        config: the trained Decoder's config.
        device, dtype: where and in what dtype the weights (and so the activations) live.
        impl: "triton" (CUDA, or CPU under TRITON_INTERPRET=1) or "eager": the trunk ops' implementation.
        gemv_max_tokens: with impl "triton", forwards of at most this many tokens run the few-token
            GEMV layers (module docstring); 0 (this class's default) never does.
        skinny_max_tokens: with impl "triton", forwards of more than gemv_max_tokens and at most this
            many tokens run the skinny-GEMM layers (module docstring); 0 (the default) never does.
        gemv_pdl: the GEMV layers' kernels launch with programmatic dependent launch (a CUDA device
            of compute capability >= 9: `kernels.common.pdl_available`); the skinny layers' never do.
    """

    def __init__(self, config: DecoderConfig, *, device: torch.device | str, dtype: torch.dtype, impl: str,
                 gemv_max_tokens: int = 0, skinny_max_tokens: int = 0, gemv_pdl: bool = False) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config, self.impl, self.gemv_max_tokens, self.gemv_pdl = config, impl, gemv_max_tokens, gemv_pdl
        self.skinny_max_tokens = skinny_max_tokens
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.layers = nn.ModuleList(Layer(config, i, impl, **factory) for i in range(config.num_layers))
        self.norm = nn.Parameter(torch.empty(config.hidden_size, **factory))
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                    bias=False, **factory)
        self.requires_grad_(False)
        self._rope: torch.Tensor | None = None

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """LM head matrix [V, H] (the embedding matrix when tied)."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                cache: PagedCache, head: Head) -> torch.Tensor:
        """`head(final-norm hidden states, lm_head_weight)` of one packed batch.

        Args:
            input_ids: [T] int64 token ids.
            positions: [T] int64 absolute position of each token in its sequence.
            cu_seqlens, max_seqlen: the packing, as `Decoder.forward` takes it (the runner calls
                both models alike); not read here, the cache holds its own layout.
            cache: this forward's `PagedCache`.
            head: maps (hidden [T, H], lm_head_weight [V, H]) to the result.
        """
        x, residual = self.embed(input_ids), None  # (T, H)
        rope, eps = self.rope_table(), self.config.rms_norm_eps
        path = self.layer_path(x.shape[0])
        if path != "plain":
            pdl = self.launches_with_pdl(x.shape[0])
            for layer in self.layers:
                if path == "gemv":
                    x, residual = layer.forward_gemv(x, residual, positions, rope, cache, pdl=pdl)
                else:
                    x, residual = layer.forward_skinny(x, residual, positions, rope, cache)
            hidden, _ = add_rms_norm_partials(x, residual, self.norm, eps, pdl=pdl)
        else:
            for layer in self.layers:
                x, residual = layer(x, residual, positions, rope, cache)
            hidden, _ = add_rms_norm(x, residual, self.norm, eps, impl=self.impl)
        return head(hidden, self.lm_head_weight)

    def layer_path(self, num_tokens: int) -> str:
        """Which layers a forward of ``num_tokens`` runs (module docstring): "gemv" (few-token GEMVs),
        "skinny" (tensor-core skinny GEMMs) or "plain" (cuBLAS GEMMs and the fused elementwise ops)."""
        if self.impl != "triton":
            return "plain"
        if num_tokens <= self.gemv_max_tokens:
            return "gemv"
        return "skinny" if num_tokens <= self.skinny_max_tokens else "plain"

    def launches_with_pdl(self, num_tokens: int) -> bool:
        """A forward of ``num_tokens`` launches its kernels with programmatic dependent launch: the
        GEMV layers with `gemv_pdl`, never the skinny ones (on an H100 their decode step at 16 rows
        took 1.36 GPU ms with it, 1.10 without: benchmarks/RESULTS.md)."""
        return self.gemv_pdl and self.layer_path(num_tokens) == "gemv"

    def rope_table(self) -> torch.Tensor:
        """`decoder.rope_table(config)` on the weights' device, computed once: [P, 2, head_dim] fp32."""
        if self._rope is None:
            self._rope = rope_table(self.config, self.embed.weight.device)
        return self._rope

    def decoder_views(self) -> dict[str, torch.Tensor]:
        """Every weight under its `Decoder` state-dict name, as a view into this model's (packed) tensors."""
        c = self.config
        views = {"embed.weight": self.embed.weight, "norm": self.norm}
        if self.lm_head is not None:
            views["lm_head.weight"] = self.lm_head.weight
        qkv_rows = [c.num_heads * c.head_dim] + [c.num_kv_heads * c.head_dim] * 2
        for i, layer in enumerate(self.layers):
            p, attn, mlp = f"blocks.{i}.", layer.attn, layer.mlp
            views[p + "attn_norm"], views[p + "mlp_norm"] = layer.attn_norm, layer.mlp_norm
            for kind in ("weight", "bias") if c.qkv_bias else ("weight",):
                for name, view in zip(("wq", "wk", "wv"), getattr(attn.qkv, kind).split(qkv_rows)):
                    views[f"{p}attn.{name}.{kind}"] = view
            views[p + "attn.wo.weight"] = attn.o.weight
            if c.out_bias:
                views[p + "attn.wo.bias"] = attn.o.bias
            gate, up = mlp.gate_up.weight.chunk(2)
            views[p + "mlp.w_gate.weight"], views[p + "mlp.w_up.weight"] = gate, up
            views[p + "mlp.w_down.weight"] = mlp.down.weight
        return views

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy `(Decoder state-dict name, whole tensor)` pairs into the packed weights, in place,
        cast to this model's dtype; every Decoder weight must come once, and no other name."""
        views = self.decoder_views()
        seen = set()
        for name, t in weights:
            if name not in views:
                raise KeyError(f"load_weights: {name!r} is not a weight of a Decoder of this config")
            if t.shape != views[name].shape:
                raise ValueError(f"load_weights: {name!r} has shape {tuple(t.shape)}, this config's is "
                                 f"{tuple(views[name].shape)}")
            views[name].copy_(t)
            seen.add(name)
        if len(seen) != len(views):
            raise KeyError(f"load_weights: {len(views) - len(seen)} Decoder weight(s) not given, "
                           f"e.g. {sorted(set(views) - seen)[0]!r}")
