"""Load and save our Decoder / TokenRewardModel in Hugging Face formats.

A model reference (`ref`) is one of:
  - a Hugging Face hub id (`Qwen/Qwen2.5-0.5B-Instruct`), read through the local HF cache;
  - a local HF folder (config.json + *.safetensors);
  - a path to a `.gguf` file (transformers dequantises it, then we convert its state dict);
  - `package://<module>/<file>.gguf`, a GGUF file shipped inside an installed Python package.

Weights cross the boundary only through `FROM_HF`, an explicit name map (`{}` = layer index,
None = dropped key), and every load asserts the key set and every shape. Not here: the model
math (`decoder.py`), optimizer or trainer state.
Invariant: `save_hf_checkpoint` writes what `transformers.AutoModelForCausalLM.from_pretrained`
reads back to the same logits, and `load_decoder` of that folder gives back the same tensors.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from oreal_fast.model.attention import resolve_backend_name
from oreal_fast.package_refs import is_package_ref, resolve_package_ref
from oreal_fast.model.decoder import EAGER_OPS, ROPE_TYPES, Decoder, DecoderConfig, TokenRewardModel, TrunkOps

# HF key -> our key. Keys mapped to None are known and dropped.
FROM_HF: dict[str, str | None] = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{}.input_layernorm.weight": "blocks.{}.attn_norm",
    "model.layers.{}.self_attn.q_proj.weight": "blocks.{}.attn.wq.weight",
    "model.layers.{}.self_attn.q_proj.bias": "blocks.{}.attn.wq.bias",
    "model.layers.{}.self_attn.k_proj.weight": "blocks.{}.attn.wk.weight",
    "model.layers.{}.self_attn.k_proj.bias": "blocks.{}.attn.wk.bias",
    "model.layers.{}.self_attn.v_proj.weight": "blocks.{}.attn.wv.weight",
    "model.layers.{}.self_attn.v_proj.bias": "blocks.{}.attn.wv.bias",
    "model.layers.{}.self_attn.o_proj.weight": "blocks.{}.attn.wo.weight",
    "model.layers.{}.self_attn.o_proj.bias": "blocks.{}.attn.wo.bias",
    "model.layers.{}.self_attn.rotary_emb.inv_freq": None,  # old checkpoints stored the rope table
    "model.layers.{}.post_attention_layernorm.weight": "blocks.{}.mlp_norm",
    "model.layers.{}.mlp.gate_proj.weight": "blocks.{}.mlp.w_gate.weight",
    "model.layers.{}.mlp.up_proj.weight": "blocks.{}.mlp.w_up.weight",
    "model.layers.{}.mlp.down_proj.weight": "blocks.{}.mlp.w_down.weight",
    "model.norm.weight": "norm",
    "lm_head.weight": "lm_head.weight",  # dropped when tied or when the head is not wanted
}
TO_HF: dict[str, str] = {ours: hf for hf, ours in FROM_HF.items() if ours is not None}
_LAYER = re.compile(r"\.(\d+)\.")


def _map_key(key: str, table: dict[str, str | None]) -> tuple[bool, str | None]:
    """(known, mapped name) of one key; its first layer index is matched as `{}`."""
    m = _LAYER.search(key)
    template = key if m is None else key[: m.start()] + ".{}." + key[m.end():]
    if template not in table:
        return False, None
    target = table[template]
    return True, (target if target is None or m is None else target.format(m.group(1)))


def config_from_hf(hf_config) -> DecoderConfig:
    """Our DecoderConfig from a transformers Llama/Qwen2 config; unsupported features are errors."""
    family = hf_config.model_type
    if family not in ("llama", "qwen2"):
        raise ValueError(f"model_type {family!r} is not supported: expected 'llama' or 'qwen2'")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported: expected 'silu'")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported")
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("use_sliding_window=True is not supported")
    rope = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    theta = rope.pop("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported: expected one of {ROPE_TYPES}")
    attn_bias = bool(getattr(hf_config, "attention_bias", False))
    H, num_heads = hf_config.hidden_size, hf_config.num_attention_heads
    return DecoderConfig(
        family=family,
        vocab_size=hf_config.vocab_size,
        hidden_size=H,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(hf_config, "head_dim", None) or H // num_heads,
        rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=float(theta),
        rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
        tie_embeddings=bool(hf_config.tie_word_embeddings),
        qkv_bias=True if family == "qwen2" else attn_bias,
        out_bias=False if family == "qwen2" else attn_bias,
        max_position_embeddings=hf_config.max_position_embeddings,
        init_std=getattr(hf_config, "initializer_range", 0.02),
    )


def hf_config_from(config: DecoderConfig, dtype: torch.dtype):
    """A transformers LlamaConfig / Qwen2Config describing `config` (weights stored in `dtype`)."""
    from transformers import LlamaConfig, Qwen2Config

    if config.family == "qwen2" and (not config.qkv_bias or config.out_bias):
        raise ValueError("a qwen2 checkpoint has q/k/v bias and no o_proj bias; this config does not")
    if config.family == "llama" and config.qkv_bias != config.out_bias:
        raise ValueError("a llama checkpoint has bias on all of q/k/v/o or on none; this config does not")
    rope = {"rope_type": "default", **(config.rope_scaling or {}), "rope_theta": config.rope_theta}
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=config.tie_embeddings,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.init_std,
        hidden_act="silu",
        dtype=dtype,
    )
    if config.family == "qwen2":
        return Qwen2Config(architectures=["Qwen2ForCausalLM"], **common)
    return LlamaConfig(architectures=["LlamaForCausalLM"], attention_bias=config.qkv_bias, mlp_bias=False, **common)


def _convert(
    state: dict[str, torch.Tensor], model: torch.nn.Module, table: dict, source: str
) -> dict[str, torch.Tensor]:
    """Rename `state` through `table` and check it fills exactly `model`'s parameters, shape by shape."""
    expected = {k: v.shape for k, v in model.state_dict().items()}
    out = {}
    for key, tensor in state.items():
        known, target = _map_key(key, table)
        if not known:
            raise ValueError(f"{source}: unexpected weight {key!r} (not in the Llama/Qwen2 name map)")
        if target is None or target not in expected:
            continue  # dropped by the map, or a head this model does not have
        if tuple(tensor.shape) != tuple(expected[target]):
            raise ValueError(
                f"{source}: {key} has shape {tuple(tensor.shape)}, the config needs {tuple(expected[target])}"
            )
        out[target] = tensor
    missing = sorted(set(expected) - set(out))
    if missing:
        raise ValueError(f"{source}: {len(missing)} weights missing, e.g. {missing[:3]}")
    assert len(out) == len(expected)
    return out


@dataclass(frozen=True)
class ResolvedRef:
    """Where a model reference points: an HF folder or hub id, or a GGUF file in a folder."""

    location: str  # local folder or hub id
    gguf_file: str | None  # file name inside `location` for GGUF refs


def resolve_ref(ref: str) -> ResolvedRef:
    """Classify a model reference (see module docstring); nothing is loaded."""
    if is_package_ref(ref):
        try:
            path = Path(resolve_package_ref(ref))
        except ValueError as e:
            raise ValueError(f"model ref {e}") from e
        if not path.is_file():
            raise ValueError(f"model ref {ref!r}: the package has no file {path.name!r}")
        return ResolvedRef(str(path.parent), path.name)
    if ref.endswith(".gguf"):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ValueError(f"model ref {ref!r}: no such GGUF file")
        return ResolvedRef(str(path.parent.resolve()), path.name)
    return ResolvedRef(ref, None)


def _hf_weights(location: str) -> dict[str, torch.Tensor]:
    """All tensors of the *.safetensors files of a local folder or a hub id (through the HF cache)."""
    folder = Path(location).expanduser()
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(location, allow_patterns=["*.json", "*.safetensors"]))
        except Exception as e:  # network, auth or cache miss: all mean "cannot get this model"
            raise ValueError(
                f"model ref {location!r}: not a local folder and not fetchable from the HF hub ({e})"
            ) from e
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model ref {location!r}: no *.safetensors files in {folder}")
    state = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            state.update({k: fh.get_tensor(k) for k in fh.keys()})
    return state


def _load_hf_state(ref: str):
    """(transformers config, HF-named state dict) for any ref."""
    from transformers import AutoConfig, AutoModelForCausalLM

    where = resolve_ref(ref)
    if where.gguf_file is not None:
        hf = AutoModelForCausalLM.from_pretrained(where.location, gguf_file=where.gguf_file, dtype=torch.float32)
        return hf.config, hf.state_dict()
    try:
        hf_config = AutoConfig.from_pretrained(where.location)
    except OSError as e:
        raise ValueError(f"model ref {ref!r}: cannot read its config.json ({e})") from e
    return hf_config, _hf_weights(where.location)


def decoder_from_hf(
    hf_config, hf_state: dict[str, torch.Tensor], *, dtype: torch.dtype, device: torch.device | str,
    attn_backend: str = "auto", with_lm_head: bool = True, source: str = "checkpoint",
    compute_dtype: torch.dtype | None = None, trunk_ops: TrunkOps = EAGER_OPS,
) -> Decoder:
    """Build our Decoder from a transformers config and an HF-named state dict (e.g. `hf_model.state_dict()`).

    `source` names the checkpoint in error messages; `compute_dtype` (default `dtype`) picks the
    attention backend; `trunk_ops` are the Decoder's elementwise ops.
    """
    config = config_from_hf(hf_config)
    backend = resolve_backend_name(attn_backend, device, compute_dtype or dtype)
    model = Decoder(config, attn_backend=backend, with_lm_head=with_lm_head, device="meta", dtype=dtype,
                    compute_dtype=compute_dtype, trunk_ops=trunk_ops)
    state = _convert(hf_state, model, FROM_HF, source)
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, assign=True)
    return model


def load_decoder(
    ref: str, *, dtype: torch.dtype, device: torch.device | str, attn_backend: str = "auto",
    with_lm_head: bool = True, compute_dtype: torch.dtype | None = None, trunk_ops: TrunkOps = EAGER_OPS,
) -> Decoder:
    """Load a Llama/Qwen2 checkpoint into our Decoder.

    Args:
        ref: hub id, local HF folder, .gguf path or package://<module>/<file>.gguf.
        dtype: parameter dtype (e.g. torch.bfloat16).
        device: where the parameters live.
        attn_backend: "auto", "sdpa", "varlen", "cudnn", "by_length" or "by_length_runs" (see attention.py).
        with_lm_head: False drops an untied LM head (reward-model backbones).
        compute_dtype: the dtype forwards compute in (autocast), default `dtype`; it picks the
            attention backend.
        trunk_ops: the elementwise ops of the trunk (default the eager ones; the trainer passes
            `oreal_fast.kernels.trunk_train.TRAIN_OPS` on CUDA).

    Returns:
        The Decoder (in training mode, as any new nn.Module).
    """
    hf_config, hf_state = _load_hf_state(ref)
    return decoder_from_hf(
        hf_config, hf_state, dtype=dtype, device=device, attn_backend=attn_backend,
        with_lm_head=with_lm_head, source=ref, compute_dtype=compute_dtype, trunk_ops=trunk_ops,
    )


def load_token_rm(
    ref: str, *, dtype: torch.dtype, device: torch.device | str, attn_backend: str = "auto",
    compute_dtype: torch.dtype | None = None, trunk_ops: TrunkOps = EAGER_OPS,
) -> TokenRewardModel:
    """Backbone from `ref` (its LM head dropped) plus a zero-initialised score head (reference Q1)."""
    backbone = load_decoder(ref, dtype=dtype, device=device, attn_backend=attn_backend, with_lm_head=False,
                            compute_dtype=compute_dtype, trunk_ops=trunk_ops)
    return TokenRewardModel(backbone)


def load_tokenizer(ref: str):
    """The tokenizer of a model reference (same forms as `load_decoder`)."""
    from transformers import AutoTokenizer

    where = resolve_ref(ref)
    if where.gguf_file is not None:
        return AutoTokenizer.from_pretrained(where.location, gguf_file=where.gguf_file)
    try:
        return AutoTokenizer.from_pretrained(where.location)
    except OSError as e:
        raise ValueError(f"model ref {ref!r}: cannot load its tokenizer ({e})") from e


def save_hf_checkpoint(model: Decoder, tokenizer, folder: str, *, dtype: torch.dtype,
                       weights: dict[str, torch.Tensor] | None = None) -> None:
    """Write an HF folder: config.json, model.safetensors (in `dtype`) and the tokenizer files.

    Args:
        model: a Decoder with its LM head.
        tokenizer: a transformers tokenizer, or None to write weights and config only.
        folder: created if missing; existing files of the same names are replaced.
        dtype: storage dtype of the weights.
        weights: the state dict to write (default `model.state_dict()`); an FSDP2 model passes its
            gathered one (`parallel.full_state_dict`).
    """
    if not model.has_lm_head:
        raise ValueError("save_hf_checkpoint: the model has no LM head (a reward-model backbone is not a causal LM)")
    os.makedirs(folder, exist_ok=True)
    state = {
        _map_key(k, TO_HF)[1]: v.detach().to(device="cpu", dtype=dtype).contiguous()
        for k, v in (model.state_dict() if weights is None else weights).items()
    }
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    hf_config_from(model.config, dtype).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)

