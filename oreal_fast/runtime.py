"""Where and in what precision this process computes, decided once per run, and the models held that way.

`build_runtime` resolves, from the config, the device (``auto``: CUDA when visible) and one compute
dtype, and carries the data-parallel rank (``parallel.init_data_parallel``). Both precisions a
forward can meet derive from that one dtype: the autocast around the forwards
(`Precision.autocast`) and FSDP2's mixed-precision policy (`Precision.fsdp_policy`), so a config's
``dtype`` is what every matmul computes in, with or without ``torchrun``. `resolve_kernel_impl`
turns ``loss_impl`` into the LM-head kernels' ``impl`` for the device.

`load_rl_models` loads the three models of the RL phase as the runtime says (the trained actor and
token RM as fp32 masters, the frozen reference in the compute dtype, their trunks' elementwise ops
as ``trunk_kernels`` picks them, their attention backend as ``attention_backend`` names it) and
prepares them in torchtitan's order: activation recompute of the trained trunks
(``recompute.apply_recompute_plan``, planned once every model is loaded), then compile (nothing here
is compiled: the trunk runs eager or through its own kernels), then ``fully_shard`` per block and the
root (`prepare_model`). `load_frozen` and `load_chat_tokenizer` serve evaluation the same way.

Not here: the LM-head kernels' casts (each kernel casts its inputs to the autocast dtype itself),
the rollout engines' precision (``rollout.build_rollout`` hands them the compute dtype), the
trained weights' compute-dtype copies of one RL phase (``cast_once``, with ``weights_cast_once``).
Invariant: after `build_runtime`, no module decides a dtype of its own; trained weights and their
optimiser states are fp32 (``MASTER_DTYPE``), everything a forward computes is ``compute_dtype``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from oreal_fast.config import ConfigError, TrainConfig, validate_stop_word
from oreal_fast.kernels.trunk_train import trunk_ops_for
from oreal_fast.model.decoder import EAGER_OPS, Decoder, TokenRewardModel, TrunkOps, max_rope_positions
from oreal_fast.model.hf_io import load_decoder, load_token_rm, load_tokenizer
from oreal_fast.parallel import DataParallel, parallelize
from oreal_fast.recompute import apply_recompute_plan

log = logging.getLogger("oreal_fast")

# Trained weights stay fp32 masters, and AdamW's moments take their dtype (reference 1.1).
MASTER_DTYPE = torch.float32
_NAMED_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Precision:
    """The device and the one dtype its forwards compute in."""

    device: torch.device
    compute_dtype: torch.dtype

    @property
    def uses_autocast(self) -> bool:
        """Forwards run under autocast: the compute dtype is a 16-bit one, below the fp32 masters'."""
        return self.compute_dtype in (torch.bfloat16, torch.float16)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to ``compute_dtype`` around a forward when it is a 16-bit dtype; none for fp32 (the
        masters' dtype) or fp64 (the CPU tests that compare two computations to rounding)."""
        if not self.uses_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def fsdp_policy(self) -> MixedPrecisionPolicy:
        """FSDP2 gathers parameters in ``compute_dtype`` and reduces gradients in fp32."""
        return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)


@dataclass(frozen=True)
class Runtime:
    """This process's place and precision: what every part of a run reads instead of deciding.

    Attributes:
        precision: the device and the compute dtype.
        dp: the data-parallel rank (rank 0 of 1 without ``torchrun``).
    """

    precision: Precision
    dp: DataParallel = DataParallel()

    @property
    def device(self) -> torch.device:
        return self.precision.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.precision.compute_dtype


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when visible, else CPU (the config has checked that a named one exists).

    A CUDA device comes with its index (the current device): the memory queries and caps of
    ``torch.cuda`` refuse a bare ``cuda``.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device(name)


def resolve_compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """``dtype``: a named one, or ``auto`` = bf16 on a GPU that has it, else fp16; fp32 on CPU
    (bf16 matmuls are slow there)."""
    if name in _NAMED_DTYPES:
        return _NAMED_DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def resolve_kernel_impl(name: str, device: torch.device) -> str:
    """``loss_impl`` -> the kernels' ``impl``: auto = Triton kernels on CUDA, the eager twin on CPU."""
    if name == "auto":
        return "triton" if device.type == "cuda" else "eager"
    return name


def build_runtime(cfg: TrainConfig, dp: DataParallel = DataParallel()) -> Runtime:
    """The run's runtime; applies ``gpu_memory_limit_gib`` to this process once."""
    device = resolve_device(cfg.device)
    if cfg.gpu_memory_limit_gib is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_limit_gib * 2**30 / total, device)
    return Runtime(Precision(device, resolve_compute_dtype(cfg.dtype, device)), dp)


# ----------------------------------------------------------------------------- models


@dataclass
class RLModels:
    """The three models of the RL phase; ``token_rm`` is None when the config has no RM."""

    actor: Decoder
    reference: Decoder
    token_rm: TokenRewardModel | None


@contextlib.contextmanager
def model_ref_errors(cfg: TrainConfig, key: str) -> Iterator[None]:
    """A model or tokenizer that cannot be loaded is a config error naming its key (one line on the
    command line, exit 2), not a traceback from deep inside the loader."""
    try:
        yield
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key} in {cfg.config_path}: {e}") from e


def load_chat_tokenizer(cfg: TrainConfig) -> tuple[Any, int]:
    """The actor's tokenizer with the config's chat template, and the stop word's token id."""
    log.info(f"loading the tokenizer of actor {cfg.actor}")
    with model_ref_errors(cfg, "actor"):
        tokenizer = load_tokenizer(cfg.actor)
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer, validate_stop_word(cfg, tokenizer)


def prepare_model(model: torch.nn.Module, trunk: Decoder, runtime: Runtime) -> None:
    """torchtitan's order after activation recompute (applied to ``trunk`` before this) and compile
    (none here), in place: under data parallelism ``fully_shard`` per block of ``trunk`` and on
    ``model`` last, gathering in the compute dtype."""
    if runtime.dp.enabled:
        parallelize(model, trunk.blocks, runtime.precision.fsdp_policy())


def load_frozen(cfg: TrainConfig, key: str, runtime: Runtime, trunk_ops: TrunkOps = EAGER_OPS) -> Decoder:
    """The model config ``key`` names (``actor`` or ``reference``), in the compute dtype, frozen,
    in eval mode; its rope table must cover ``gen_max_length``."""
    log.info(f"loading {key} {getattr(cfg, key)} (frozen, {runtime.compute_dtype}, {runtime.device})")
    with model_ref_errors(cfg, key):
        model = load_decoder(getattr(cfg, key), dtype=runtime.compute_dtype, device=runtime.device,
                             attn_backend=cfg.attention_backend, trunk_ops=trunk_ops)
    _check_rope(cfg, key, model)
    return model.requires_grad_(False).eval()


def load_rl_models(cfg: TrainConfig, runtime: Runtime) -> tuple[RLModels, str]:
    """Actor and token RM as fp32 masters, the frozen reference in the compute dtype (1.1), every
    trunk with the ops ``trunk_kernels`` picks; the trained trunks recompute the blocks
    ``apply_recompute_plan`` chooses (``selective_recompute``, or planned from the memory cap with
    every model loaded), then each model is `prepare_model`'d.

    Returns:
        The models, and one line for the run's log: the blocks each trained model recomputes and why.
    """
    device, compute = runtime.device, runtime.compute_dtype
    ops = trunk_ops_for(cfg.trunk_kernels, device)
    log.info(f"loading actor {cfg.actor} (trained: {MASTER_DTYPE} masters, {device})")
    with model_ref_errors(cfg, "actor"):
        actor = load_decoder(cfg.actor, dtype=MASTER_DTYPE, device=device, compute_dtype=compute,
                             attn_backend=cfg.attention_backend, trunk_ops=ops)
    _check_rope(cfg, "actor", actor)
    reference = load_frozen(cfg, "reference", runtime, trunk_ops=ops)
    token_rm = None
    if cfg.token_level_rm is not None:
        log.info(f"loading token_level_rm {cfg.token_level_rm} (trained: {MASTER_DTYPE} masters, {device})")
        with model_ref_errors(cfg, "token_level_rm"):
            token_rm = load_token_rm(cfg.token_level_rm, dtype=MASTER_DTYPE, device=device, compute_dtype=compute,
                                     attn_backend=cfg.attention_backend, trunk_ops=ops)
    note = apply_recompute_plan(cfg, [actor] + ([token_rm.backbone] if token_rm is not None else []), compute)
    prepare_model(actor, actor, runtime)
    prepare_model(reference, reference, runtime)
    if token_rm is not None:
        prepare_model(token_rm, token_rm.backbone, runtime)
    return RLModels(actor, reference, token_rm), note


def _check_rope(cfg: TrainConfig, key: str, model: Decoder) -> None:
    limit = max_rope_positions(model.config)
    if cfg.gen_max_length > limit:
        raise ConfigError(f"gen_max_length in {cfg.config_path}: {cfg.gen_max_length} is above the {limit} "
                          f"positions the rope table of {key} {getattr(cfg, key)!r} covers")
