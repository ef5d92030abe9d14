"""The Llama / Qwen2 decoder family on packed varlen rows, and the token-level reward model.

One implementation covers both families; the differences (q/k/v bias, tied embeddings, rope
theta and scaling, GQA, RMSNorm eps) are config fields. Activations are `[T, H]` for a packed row
of N sequences (`cu_seqlens` [N+1], `positions` restarting at 0 per sequence): no batch dim, no
padding. A caller that packed the row on the host passes its bounds as host ints too
(`cu_seqlens_host`): attention backends that split the row per sequence read those, and no layer
copies `cu_seqlens` back to the host. `Decoder.forward` returns the final-norm hidden states, or,
given a `head`, whatever that function makes of the hidden states and the LM-head matrix (the fused
loss kernels, the sampler's logits): the head runs inside `forward`, so wrappers that gather
parameters around a module's forward (FSDP2) see it, and no `[T, V]` tensor is made here unless the
head makes one.

Generation passes a `cache` (any object with `attend(layer, q, k, v) -> out`, built by the rollout
engine or the reference sampler for this forward): every attention layer then hands its new q, k, v
to the cache, which stores k, v and attends over what it holds. The decoder keeps no cache state.

Precision: q, k and v reach attention in one dtype, the dtype of the q/k/v projections (bf16 under
autocast, the parameter dtype otherwise): the rope tables are cast to it. The attention backend is
picked at construction for the *compute* dtype (`compute_dtype`, default the parameter dtype).

Elementwise ops (RMSNorm, rope, SwiGLU) come from `TrunkOps`: the eager, differentiable forms
below by default (`EAGER_OPS`); a caller may pass fused kernels of the same math (the trained
models on CUDA take `oreal_fast.kernels.trunk_train.TRAIN_OPS`, which have a backward; the rollout
engine runs its own decoder, `rollout/engine/inference_model.py`). This module imports no Triton;
the kernel files take the eager forms here as their oracle.

Merged projections: during an RL phase with ``merged_projections``, `oreal_fast.cast_once` sets each
`Attention`'s and `MLP`'s ``merged_weight`` (the stacked compute-dtype copy of wq|wk|wv, w_gate|w_up;
``merged_bias`` for q|k|v): the block then runs one GEMM for q/k/v and one for gate/up, and SwiGLU
takes the packed output (`TrunkOps.silu_mul_packed`). The parameters and their names never change.

Not here: HF name mapping and file I/O (`hf_io.py`), attention kernels (`attention.py`).
Invariant: numerics follow transformers' Llama/Qwen2 modules op for op (fp32 RMSNorm statistics,
rope tables computed in fp32 then cast), so the same weights give the same hidden states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from oreal_fast.model.attention import AttentionBackend, make_backend, resolve_backend_name

ROPE_TYPES = ("default", "linear", "llama3")
# The rope table covers at least this many positions (OREAL's gen_max_length is 16 384), even for a
# checkpoint that declares a shorter context: transformers also lets positions run past it.
MIN_ROPE_POSITIONS = 32768


@dataclass(frozen=True)
class DecoderConfig:
    """Architecture of one Llama- or Qwen2-family decoder."""

    family: str  # "llama" or "qwen2": the transformers architecture a saved checkpoint declares
    vocab_size: int  # rows of the embedding and of the LM head (may exceed the tokenizer)
    hidden_size: int  # H, width of the residual stream
    intermediate_size: int  # width of the SwiGLU hidden layer
    num_layers: int  # number of transformer blocks
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA when < num_heads)
    head_dim: int  # per-head width (usually H / num_heads)
    rms_norm_eps: float = 1e-6  # epsilon inside every RMSNorm
    rope_theta: float = 10000.0  # rope base
    rope_scaling: dict[str, float] | None = None  # {"rope_type": "linear"|"llama3", ...} or None
    tie_embeddings: bool = False  # LM head shares the embedding matrix
    qkv_bias: bool = False  # bias on q/k/v projections (True for Qwen2)
    out_bias: bool = False  # bias on the attention output projection (Llama attention_bias)
    max_position_embeddings: int = 32768  # carried into saved configs; not a limit here
    init_std: float = 0.02  # std of the normal init of every matrix

    def __post_init__(self) -> None:
        if self.family not in ("llama", "qwen2"):
            raise ValueError(f"DecoderConfig.family {self.family!r}: expected 'llama' or 'qwen2'")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"DecoderConfig: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"DecoderConfig.head_dim {self.head_dim}: rope needs an even head_dim")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"DecoderConfig.rope_scaling: rope_type {rope_type!r} not supported, use one of {ROPE_TYPES}"
            )

    def num_params(self, include_embeddings: bool = True) -> int:
        """Number of parameters (the tied head counted once)."""
        H, D, I = self.hidden_size, self.head_dim, self.intermediate_size
        q_out, kv_out = self.num_heads * D, self.num_kv_heads * D
        attn = H * (q_out + 2 * kv_out) + q_out * H
        attn += (q_out + 2 * kv_out) * self.qkv_bias + H * self.out_bias
        per_layer = attn + 3 * H * I + 2 * H
        embeds = self.vocab_size * H * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + H + (embeds if include_embeddings else 0)


def rope_inv_freq(config: DecoderConfig, device: torch.device) -> torch.Tensor:
    """Inverse rope frequencies [head_dim / 2] fp32, with linear or llama3 scaling applied."""
    D = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def max_rope_positions(config: DecoderConfig) -> int:
    """Positions the rope table covers: a forward takes positions 0 .. this - 1."""
    return max(config.max_position_embeddings, MIN_ROPE_POSITIONS)


def rope_table(config: DecoderConfig, device: torch.device) -> torch.Tensor:
    """cos and sin of every position below P = max(max_position_embeddings, MIN_ROPE_POSITIONS):
    [P, 2, head_dim] fp32.

    Computed once per device (in fp32, as transformers does per forward) and indexed by position,
    so a forward does no trigonometry and a captured decode step allocates nothing for rope.
    """
    inv_freq = rope_inv_freq(config, device)
    positions = torch.arange(max_rope_positions(config), device=device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # (P, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (P, D)
    return torch.stack((emb.cos(), emb.sin()), dim=1)  # (P, 2, D)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalised x, the statistics in fp32 and the normalised x rounded to x's dtype
    before the weight multiplies it (transformers' Llama/Qwen2 RMSNorm)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by the half-split convention of HF Llama checkpoints; cos, sin
    [T, 1, D] fp32 rows of `rope_table`, cast to x's dtype first as transformers does."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: silu(gate) * up."""
    return F.silu(gate) * up


def silu_mul_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on the output of one gate|up GEMM: gate_up [T, 2I] = [gate | up] on the
    last dim -> silu(gate) * up [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)  # (T, I) views each
    return silu_mul(gate, up)


@dataclass(frozen=True)
class TrunkOps:
    """The elementwise ops of the trunk, each with the signature of the eager form above.

    ``add_rms_norm(x, delta, weight, eps) -> (rms_norm(x + delta), x + delta)`` is the residual add
    fused with the norm after it; None means the add, then ``rms_norm`` (what `add_norm` does).
    """

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    apply_rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # x [T, heads, D], cos, sin
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    silu_mul_packed: Callable[[torch.Tensor], torch.Tensor]  # gate_up [T, 2I] -> [T, I], the merged MLP's
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float],
                           tuple[torch.Tensor, torch.Tensor]] | None = None

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(x + delta), x + delta), fused when the ops have a fused form."""
        if self.add_rms_norm is not None:
            return self.add_rms_norm(x, delta, weight, eps)
        x = x + delta
        return self.rms_norm(x, weight, eps), x


# Eager ops, differentiable: training and every model autograd sees.
EAGER_OPS = TrunkOps(rms_norm, apply_rope, silu_mul, silu_mul_packed)


class AttentionCache(Protocol):
    """What generation hands `Decoder.forward`: stores each layer's new keys and values and attends
    the new queries over everything cached for their sequence (the new tokens included, causally)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D], one dtype -> out [T, Hq, D]."""
        ...


# A head maps (hidden [T, H], lm_head_weight [V, H]) to whatever the caller needs.
Head = Callable[[torch.Tensor, torch.Tensor], Any]


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, layer_idx: int, backend: AttentionBackend, ops: TrunkOps,
                 **factory) -> None:
        super().__init__()
        H, D = config.hidden_size, config.head_dim
        self.layer_idx, self.ops = layer_idx, ops
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, D
        self.backend = backend
        self.wq = nn.Linear(H, config.num_heads * D, bias=config.qkv_bias, **factory)
        self.wk = nn.Linear(H, config.num_kv_heads * D, bias=config.qkv_bias, **factory)
        self.wv = nn.Linear(H, config.num_kv_heads * D, bias=config.qkv_bias, **factory)
        self.wo = nn.Linear(config.num_heads * D, H, bias=config.out_bias, **factory)
        # wq, wk, wv stacked by rows in the compute dtype ([(Hq + 2 Hkv) D, H], bias [(Hq + 2 Hkv) D] or
        # None), set for one RL phase by oreal_fast.cast_once; None = the three projections
        self.merged_weight: torch.Tensor | None = None
        self.merged_bias: torch.Tensor | None = None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor,
        max_seqlen: int, cu_seqlens_host: tuple[int, ...] | None, cache: AttentionCache | None,
    ) -> torch.Tensor:
        T = x.shape[0]
        if self.merged_weight is None:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        else:  # one GEMM; q, k, v are column views of its output (split's backward is one cat)
            q, k, v = F.linear(x, self.merged_weight, self.merged_bias).split(
                (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                 self.num_kv_heads * self.head_dim), dim=-1)
            # rope writes new q, k; attention keeps v for its backward, and a view would keep the whole
            # [T, (Hq + 2 Hkv) D] output alive with it: v gets its own [T, Hkv D] (1/9 of it at 0.5B)
            v = v.contiguous()
        q = q.view(T, self.num_heads, self.head_dim)  # (T, Hq, D)
        k = k.view(T, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
        v = v.view(T, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
        q, k = self.ops.apply_rope(q, cos, sin), self.ops.apply_rope(k, cos, sin)
        if cache is None:
            out = self.backend(q, k, v, cu_seqlens, max_seqlen, cu_seqlens_host)
        else:
            out = cache.attend(self.layer_idx, q, k, v)
        return self.wo(out.reshape(T, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig, ops: TrunkOps, **factory) -> None:
        super().__init__()
        H, I = config.hidden_size, config.intermediate_size
        self.ops = ops
        self.w_gate = nn.Linear(H, I, bias=False, **factory)
        self.w_up = nn.Linear(H, I, bias=False, **factory)
        self.w_down = nn.Linear(I, H, bias=False, **factory)
        # w_gate, w_up stacked by rows in the compute dtype ([2I, H]), set for one RL phase by
        # oreal_fast.cast_once; None = the two projections
        self.merged_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged_weight is None:
            return self.w_down(self.ops.silu_mul(self.w_gate(x), self.w_up(x)))  # SwiGLU
        return self.w_down(self.ops.silu_mul_packed(F.linear(x, self.merged_weight)))  # gate|up in one GEMM


class Block(nn.Module):
    def __init__(self, config: DecoderConfig, layer_idx: int, backend: AttentionBackend, ops: TrunkOps,
                 **factory) -> None:
        super().__init__()
        self.eps, self.ops = config.rms_norm_eps, ops
        self.attn_norm = nn.Parameter(torch.empty(config.hidden_size, **factory))
        self.attn = Attention(config, layer_idx, backend, ops, **factory)
        self.mlp_norm = nn.Parameter(torch.empty(config.hidden_size, **factory))
        self.mlp = MLP(config, ops, **factory)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor,
        max_seqlen: int, cu_seqlens_host: tuple[int, ...] | None, cache: AttentionCache | None,
    ) -> torch.Tensor:
        h = self.attn(self.ops.rms_norm(x, self.attn_norm, self.eps), cos, sin, cu_seqlens, max_seqlen,
                      cu_seqlens_host, cache)
        normed, x = self.ops.add_norm(x, h, self.mlp_norm, self.eps)  # the residual add and the MLP's norm
        return x + self.mlp(normed)


class Decoder(nn.Module):
    """Llama/Qwen2 trunk: embed -> blocks -> final norm, on one packed row.

    `with_lm_head=False` builds a trunk without the LM head (the token-RM backbone).
    Construct on device="meta" to allocate nothing, then `to_empty(device=...)` and either
    `init_weights()` or load a state dict. Parameter names are those of `hf_io.HF_NAME_MAP`.
    `compute_dtype` is the dtype the matmuls run in (bf16 for fp32 masters under autocast); the
    attention backend is chosen for it, not for the parameter dtype. `trunk_ops` are the elementwise
    ops (default the eager, differentiable ones).
    """

    def __init__(
        self, config: DecoderConfig, *, attn_backend: str = "auto", with_lm_head: bool = True,
        device: torch.device | str | None = None, dtype: torch.dtype | None = None,
        compute_dtype: torch.dtype | None = None, trunk_ops: TrunkOps = EAGER_OPS,
    ) -> None:
        super().__init__()
        self.config = config
        self.ops = trunk_ops
        factory = {"device": device, "dtype": dtype}
        compute_dtype = compute_dtype or dtype or torch.get_default_dtype()
        # "auto" resolves for `device`; a model built on meta and moved later should name its backend
        self.attn_backend = resolve_backend_name(attn_backend, device, compute_dtype)
        backend = make_backend(self.attn_backend)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.blocks = nn.ModuleList(Block(config, i, backend, self.ops, **factory) for i in range(config.num_layers))
        self.norm = nn.Parameter(torch.empty(config.hidden_size, **factory))
        # an untied head is a separate matrix; a token-RM backbone drops it (with_lm_head=False)
        self.has_lm_head = with_lm_head
        untied = with_lm_head and not config.tie_embeddings
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory) if untied else None
        # a tied head's matrix in the compute dtype, set for one RL phase by oreal_fast.cast_once (the
        # embedding lookup keeps the master); None = the embedding matrix itself
        self.tied_head_cast: torch.Tensor | None = None
        self._rope: torch.Tensor | None = None  # rope_table() for the parameters' device, made on first use

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """LM head matrix [V, H] (the embedding matrix when tied, or its `tied_head_cast` when set)."""
        if not self.has_lm_head:
            raise AttributeError("this Decoder was built with_lm_head=False (a reward-model backbone)")
        if self.lm_head is not None:
            return self.lm_head.weight
        return self.embed.weight if self.tied_head_cast is None else self.tied_head_cast

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter in place (works after `to_empty` from meta).

        | parameter                          | init                      |
        |------------------------------------|---------------------------|
        | embed, lm_head, all Linear weights | normal(0, config.init_std)|
        | q/k/v/o biases                     | 0                         |
        | attn_norm, mlp_norm, norm          | 1                         |
        """
        for name, p in self.named_parameters():
            if name.endswith("norm"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, self.config.init_std)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        cache: AttentionCache | None = None, head: Head | None = None,
        cu_seqlens_host: tuple[int, ...] | None = None,
    ) -> Any:
        """Final-norm hidden states of a packed row, or `head(hidden, lm_head_weight)`.

        Args:
            input_ids: [T] int64 token ids of N sequences laid end to end.
            positions: [T] int64 position of each token in its own sequence (its absolute
                position in the sequence when a cache holds the earlier ones).
            cu_seqlens: [N+1] int32 sequence boundaries, 0 first and T last (read by the
                attention backend; a cache knows its own layout and ignores it).
            max_seqlen: longest sequence length in the row (host int).
            cache: the generation cache of this forward, or None for plain causal attention.
            head: applied to (hidden [T, H], lm_head_weight [V, H]) inside this forward.
            cu_seqlens_host: `cu_seqlens` as host ints (a `PackedRow`'s), or None: the "sdpa"
                backend then reads `cu_seqlens` on the host (a sync per layer) and "cudnn" refuses.

        Returns:
            hidden: [T, H] in the parameter dtype (fp32 masters under autocast stay fp32; ops
            whose norm stores the autocast dtype, as `TRAIN_OPS`, give that), or whatever `head` returns.
        """
        x = self.embed(input_ids)  # (T, H)
        cos_sin = self.rope_table()[positions]  # (T, 2, D) fp32
        cos, sin = cos_sin[:, :1], cos_sin[:, 1:]  # (T, 1, D) each
        for block in self.blocks:
            x = block(x, cos, sin, cu_seqlens, max_seqlen, cu_seqlens_host, cache)
        hidden = self.ops.rms_norm(x, self.norm, self.config.rms_norm_eps)
        return hidden if head is None else head(hidden, self.lm_head_weight)

    def rope_table(self) -> torch.Tensor:
        """`rope_table(config)` on the parameters' device, computed once: [P, 2, head_dim] fp32."""
        device = self.embed.weight.device
        if self._rope is None or self._rope.device != device:
            self._rope = rope_table(self.config, device)
        return self._rope

    def kv_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of K and V cached per token over all layers (in `dtype`, default the params')."""
        c = self.config
        itemsize = (dtype or self.embed.weight.dtype).itemsize
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize

    def estimate_flops(self, seq_lens: list[int]) -> int:
        """Forward FLOPs of the trunk on one packed row (`trunk_flops` of this config)."""
        return trunk_flops(self.config, seq_lens)


class TokenRewardModel(nn.Module):
    """Token-level reward model: a decoder trunk and a bias-free Linear(H, 1) score head.

    The head starts at zero (reference quirk Q1: the official loader zeroes it), so every score
    is 0 until the model is trained.
    """

    def __init__(self, backbone: Decoder) -> None:
        super().__init__()
        self.backbone = backbone
        w = backbone.embed.weight
        self.score_head = nn.Linear(backbone.config.hidden_size, 1, bias=False, device=w.device, dtype=w.dtype)
        self.init_head()

    @torch.no_grad()
    def init_head(self) -> None:
        """Zero the score head (works after `to_empty` from meta)."""
        self.score_head.weight.zero_()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        cu_seqlens_host: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """One score per token: scores [T] in the parameter dtype (one H-wide dot per token); the
        arguments are `Decoder.forward`'s."""
        hidden = self.backbone(input_ids, positions, cu_seqlens, max_seqlen, cu_seqlens_host=cu_seqlens_host)
        return self.score_head(hidden).squeeze(-1)


def trunk_flops(config: DecoderConfig, seq_lens: list[int]) -> int:
    """Forward FLOPs of the trunk on one packed row (no LM head; backward is about 2x this).

    Matmuls: 2 * (block weight-matrix entries) per token. Causal attention: QK^T and PV each cost
    2 * D per (query, key) pair and head, over n (n + 1) / 2 pairs per sequence of length n.
    The LM head adds 2 * V * H per scored token, and the caller knows how many it scores.
    """
    c = config
    H, q_out, kv_out = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    matmul_params = c.num_layers * (H * (2 * q_out + 2 * kv_out) + 3 * H * c.intermediate_size)
    pairs = sum(n * (n + 1) // 2 for n in seq_lens)
    return 2 * matmul_params * sum(seq_lens) + 4 * c.head_dim * c.num_heads * c.num_layers * pairs
