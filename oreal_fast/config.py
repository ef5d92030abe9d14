"""Loads a Python config file into one validated, typed :class:`TrainConfig`.

A config file is plain Python with the official trainer's flat field names (``actor``,
``gen_global_batch``, ``kl_coef``, ...), so an official OREAL config ports by copy. The loader runs
the file in a namespace of its own (as the official ``Config.fromfile`` does): every module-level
name that does not start with ``_`` becomes a key; modules, functions and classes are dropped.
A variant imports its base and changes a few fields, either ``from configs.a100_40g import *``
or ``from a100_40g import *`` (the file's folder and its parent are importable while it runs;
nothing stays in ``sys.modules`` or ``sys.path`` afterwards).

What it does not do: load models, tokenizers or data. The one check that needs a tokenizer is
:func:`validate_stop_word`, which the trainer calls once the tokenizer is loaded.

Invariant: a :class:`TrainConfig` returned by :func:`load_config` has passed every check below;
each failure is a :class:`ConfigError` whose message names the key, the file and the allowed range.
Absent keys take the official trainer's behaviour: the ``args.get`` default where the official code
has one (reference 2.1, last paragraph), otherwise the value of the official 7B config.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

# Official keys this trainer accepts so that official config files load, but that change nothing
# here (data parallelism is the only split: no tensor or sequence parallelism):
# key -> (the value that matches what we do, what the key would control).
# A config that sets another value gets one log line at start (see compatibility_notes).
COMPATIBILITY_ONLY = {
    "tp_size": (1, "tensor parallelism; one process holds each whole model"),
    "sp_size": (1, "sequence parallelism; one process holds each whole sequence"),
    "num_workers": (0, "prompt DataLoader workers; prompts are read once at start"),
    "loss_type": ("per_token", "unused by the official trainer too; the loss is normalised by global token counts"),
    "rl_global_batch": (None, "the official RL sampler's batch; every kept sample is trained once per step"),
}

# Keys that take one of a few names (checked at load; --help and docs/config.md list them).
CHOICES = {
    "dtype": ("auto", "bf16", "fp16", "fp32"), "rollout_engine": ("auto", "paged", "plain"),
    "reward_shaping_type": ("rloo", "grpo"), "kl_type": ("kl", "unbias", "mse"),
    "loss_impl": ("auto", "triton", "eager"), "trunk_kernels": ("auto", "triton", "eager"),
    "loss_kernel": ("linear_logprob", "fused_oreal_loss"), "device": ("auto", "cpu", "cuda"),
    "attention_backend": ("auto", "varlen", "sdpa", "cudnn", "by_length", "by_length_runs"),
}

# Int keys and their lowest allowed value (checked at load; --help and docs/config.md list them).
AT_LEAST = {
    "tp_size": 1, "sp_size": 1, "num_workers": 0, "gen_global_batch": 1, "gen_max_new": 1,
    "gen_max_length": 2, "gen_top_k": 0, "max_prefill_batch": 1, "prompt_repeat_k": 2,
    "kv_block_size": 1, "max_num_seqs": 1, "max_prefill_tokens": 1, "decode_steps_per_round": 1,
    "rl_global_batch": 1, "rl_mirco_batch": 1, "rl_micro_batch_tokens": 0, "warmup_steps": 0, "rm_warmup_steps": 0,
    "total_steps": 1, "actor_freeze_steps": 0, "log_interval": 1, "seed": 0, "keep_resume_states": 0,
    "val_interval": 0, "val_samples_per_problem": 0,
}

# Keys that default to another key's value when absent (the official ``args.get(key, other)``).
DEFAULTS_FROM = {
    "reference": "actor",
    "rl_global_batch": "gen_global_batch",
    "rm_warmup_steps": "warmup_steps",
    "actor_min_lr": "actor_lr",
    "token_level_rm_lr_min": "token_level_rm_lr",
}


class ConfigError(Exception):
    """A bad config value; the message names the key, the file and what is allowed."""


@dataclass
class TrainConfig:
    """Every setting of one training run (flat official names; reference section 2.1)."""

    # --- models (reference 2.1, 1.1) ---
    actor: str
    """Initial policy and tokenizer source: HF hub id, local folder, .gguf path or package://<module>/<file>."""
    datasets: str | dict | list[str | dict]
    """Prompt sources, concatenated in order. A str: a .jsonl/.json/.parquet file (or package:// ref) or a
    Hugging Face dataset id or folder (split train), with fields question, gold_answer, optional pass_rate.
    A dict: {"path": ..., "split": "test", "subset": "main", "question": "problem", "answer": "answer",
    "extract": "plain" | "gsm8k" (#### N) | "boxed"}, or {"reasoning_gym": {"chain_sum": 500}, "seed": 1};
    either may add "data_source" (default "math") and "exclude" (sources whose questions are dropped).
    Reference: docs/datasets.md."""
    reference: str | None = None
    """Frozen reference model; absent = the actor."""
    token_level_rm: str | None = None
    """Backbone of the token-level reward model; None = no RM (token weights 1.0, no RM loss)."""
    chat_template: str | None = None
    """Jinja chat template that replaces the tokenizer's; None = keep the tokenizer's own."""
    stop_word: str = "<|im_end|>"
    """The only generation stop token; must encode to exactly one token id."""
    dtype: str = "auto"
    """Compute dtype of every forward (autocast and FSDP gathers; trained weights stay fp32 masters, the
    frozen reference is held in it): auto (bf16 on a GPU that has it, else fp16; fp32 on CPU) | bf16 | fp16 | fp32."""
    selective_recompute: float | None = None
    """Fraction of decoder layers whose activations are recomputed in backward, in [0, 1] (official: 1.0);
    None = planned: no layer when a micro-batch's activations (rl_micro_batch_tokens) fit under the
    memory cap, else the fewest whole layers that make them fit (oreal_fast.recompute)."""
    cpu_offload: bool = False
    """Official: FSDP CPU offload of parameters. Not implemented here: True is a config error."""
    cuda_graph: bool = True
    """Replay the paged engine's decode steps as CUDA graphs, one per batch bucket (CUDA only)."""
    tp_size: int = 1
    """Official tensor-parallel degree. Accepted for compatibility, has no effect here (no tensor parallelism)."""
    sp_size: int = 1
    """Official sequence-parallel degree. Accepted for compatibility, has no effect here (no sequence parallelism)."""

    # --- data (reference 3) ---
    data_difficulty_balance_cfg: list[tuple[tuple[float, float], int]] | None = field(
        default_factory=lambda: [((0.0, 0.2), 6), ((0.2, 0.4), 4), ((0.4, 0.6), 4), ((0.6, 0.8), 2)]
    )
    """Buckets ((low, high), copies) on pass_rate, low <= p < high, first match wins; None/[] = no balancing."""
    num_workers: int = 0
    """Official prompt DataLoader workers. Accepted for compatibility, has no effect here: prompts are
    read once at start and tokenised in the main process."""
    max_prompts: int | None = None
    """Keep only the first N prompt records before balancing (quick runs); None = all."""

    # --- generation (reference 4.2) ---
    gen_global_batch: int = 1024
    """Samples generated per step over all ranks (= prompts per step x prompt_repeat_k)."""
    gen_max_new: int = 14000
    """Max new tokens per sample (the stop token included)."""
    gen_max_length: int = 16384
    """Max prompt + response tokens per sample."""
    gen_top_k: int = 0
    """Top-k filter size in tokens; 0 = off."""
    gen_top_p: float = 0.9
    """Nucleus sampling mass, in (0, 1]; 1 = off."""
    temperature: float = 1.0
    """Sampling temperature (generation only, never applied to training logits), > 0."""
    gen_do_sample: bool = True
    """Multinomial sampling; False = greedy."""
    max_prefill_batch: int = 16
    """Prompts per prefill chunk of the paged engine (whole prompts, packed), >= 1."""
    prompt_repeat_k: int = 16
    """Samples per prompt (k), >= 2."""

    # --- rollout engine (ours; names after vLLM's, docs/rollout.md) ---
    rollout_engine: str = "auto"
    """Generation engine: auto (paged on CUDA, plain on CPU) | paged | plain (PlainSampler)."""
    kv_cache_gib: float | None = None
    """Paged engine's KV pool in GiB, > 0, fixed; None = sized from the measured steps (docs/rollout.md)."""
    kv_cache_memory_fraction: float = 0.4
    """If kv_cache_gib is None, the KV pool until a trained step is measured: this share of the memory
    free after loading (less optimiser states to come), (0, 1]."""
    kv_block_size: int = 16
    """Token slots per KV-cache block of the paged engine, >= 1."""
    max_num_seqs: int = 1024
    """Sequences the paged engine decodes at once (the largest CUDA-graph batch; capped at gen_global_batch), >= 1."""
    max_prefill_tokens: int = 16384
    """Tokens per prefill chunk of the paged engine (vLLM's max_num_batched_tokens; a longer prompt runs alone), >= 1."""
    rollout_keep_cache: bool = True
    """Keep the paged engine's KV pool and CUDA graphs between steps; False frees them after each generation."""
    decode_steps_per_round: int = 16
    """Decode steps the paged engine runs per host round trip (stop checks on the GPU, one sync per round), >= 1."""
    overlap_decode_rounds: bool = True
    """Plan and launch each decode round before reading the last one's results (the GPU never waits for the
    host between rounds; a row that samples a stop token runs one more round without effect)."""

    # --- RL phase and optimisers (reference 4.5-4.14) ---
    rl_global_batch: int | None = None
    """Official RL batch in sequences (read only when filter_trajectory is False); absent = gen_global_batch.
    Accepted for compatibility, has no effect here: every kept sample is trained once per step."""
    rl_mirco_batch: int = 2
    """Sequences per packed RL micro-batch (official spelling); used when rl_micro_batch_tokens is 0."""
    rl_micro_batch_tokens: int = 32768
    """Token budget of a packed RL micro-batch: kept sequences are packed in order while the total
    stays within it (a longer one goes alone); 0 = the official split of rl_mirco_batch sequences.
    32768 = 2 x 16384, the official split's largest micro-batch at gen_max_length 16384, so the peak
    memory is never above what the official split can need (benchmarks/RESULTS.md)."""
    filter_trajectory: bool = True
    """Keep one correct + one incorrect sample per mixed group."""
    warmup_steps: int = 10
    """Linear LR warmup, in steps (both models' warmup test uses this one)."""
    rm_warmup_steps: int | None = None
    """Token-level RM warmup length in steps; absent = warmup_steps."""
    total_steps: int = 90
    """RL steps (capped at the number of prompt batches)."""
    actor_freeze_steps: int = 10
    """Steps at the start during which only the RM is updated."""
    actor_lr: float = 5e-7
    """Actor peak learning rate."""
    actor_min_lr: float | None = None
    """Actor cosine floor; absent = actor_lr."""
    token_level_rm_lr: float = 2e-6
    """Token-level RM peak learning rate."""
    token_level_rm_lr_min: float | None = None
    """Token-level RM cosine floor; absent = token_level_rm_lr."""
    wd: float = 0.01
    """AdamW weight decay, both models."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global L2 norm), both models."""

    # --- token weights from the RM (reference 4.10) ---
    threshold_rescale: bool = False
    """Map RM probabilities to token weights by thresholds (the official choice)."""
    correct_threshold: float = 0.5
    """Threshold for positive weights, in [0, 1)."""
    incorrect_threshold: float = 0.5
    """Threshold for negative weights, in [0, 1)."""
    topk_rescale: bool = False
    """Map RM probabilities to token weights by per-sequence top-k (alternative)."""
    correct_topk_ratio: float = 0.5
    """Fraction of a correct response's tokens weighted, in (0, 1]."""
    incorrect_topk_ratio: float = 0.5
    """Fraction of an incorrect response's tokens weighted, in (0, 1]."""

    # --- loss (reference 4.4, 4.11) ---
    reward_shaping_type: str = "rloo"
    """Advantage estimator: rloo | grpo."""
    loss_type: str = "per_token"
    """Unused by the official trainer too (normalisation is always the global token count, reference Q9).
    Accepted for compatibility, has no effect here."""
    positive_loss_factor: float = 1.0
    """Multiplier of the positive (behaviour-cloning) term."""
    negative_loss_factor: float = 0.5
    """Multiplier of the negative (policy-gradient) term."""
    pos_mult_adv: bool = False
    """Multiply the positive term by the sample's advantage."""
    kl_coef: float = 0.01
    """KL-penalty coefficient, >= 0."""
    kl_type: str = "unbias"
    """KL estimator: kl | unbias (k3) | mse."""
    shuffle_rewards: bool = False
    """A control run, not the algorithm: permute each step's rewards across its samples (seeded by seed
    and step) before the advantages, so the updates carry no signal (docs/evidence.md)."""

    # --- outputs (reference 5) ---
    work_dir: str = "work_dirs"
    """Output root; each run writes to its own timestamped sub-folder (``-2``, ``-3`` when the name is taken)."""
    keep_resume_states: int = 2
    """Resume states kept on disk, newest first; 0 = none (no --resume possible). One state is 12 bytes per
    trained parameter (fp32 weights + two AdamW moments, actor and token RM): 3.2 GB for the demo."""
    save_on_signal: bool = True
    """On SIGINT / SIGTERM, write a resume state if a step finished since the last one (then exit)."""
    checkpoint_interval: int | float = 10
    """-1 = at the end only; in (0, 1) = that fraction of total_steps; >= 1 = every N steps."""
    log_interval: int = 1
    """Text-log interval, in steps."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Trackers that get the run name, this config and every step's and validation's metrics; a name or a
    list of: tensorboard (tensorboard/ in the run folder) | wandb (pip install 'oreal-fast[wandb]'; its files
    in wandb/ of the run folder, WANDB_MODE=offline for no network) | trackio ('oreal-fast[trackio]') | none.
    Reference: docs/tracking.md."""
    seed: int = 0
    """Seed of Python random, numpy and torch; also fixes the prompt order."""
    debug: bool = False
    """DEBUG log level; trajectory dumps include token ids."""

    # --- judging (reference 4.3) ---
    judgers_config: dict[str, dict] = field(default_factory=dict)
    """Judger name -> settings (hosts, stop_word, ...), checked by the judge package."""
    data_judger_mapping: dict[str, list[str]] = field(default_factory=lambda: {"math": ["math_judger"]})
    """data_source -> names of the judgers that score it."""
    reward_fn: str | None = None
    """Your reward instead of the math judger, for every sample: "package.module:function" or
    "path/to/file.py:function", called as function(record, response, gold_answer) in the judge workers under
    the sample's judger's rule_timeout_s; returns a float (reward > 0 = correct) or a bool (+1 / -1); a
    failed call scores -1. None = the judger. Reference: docs/rewards.md."""

    # --- validation (not in the official trainer, which evaluates checkpoints separately) ---
    val_datasets: str | dict | list[str | dict] | None = None
    """Held-out problems, same forms as datasets, not difficulty-balanced; None = no validation (else it
    runs after the last step at least). --val_datasets None on the command line turns a config's
    validation off, its val_interval and val_before_train with it."""
    val_interval: int = 0
    """Also validate after every N steps, N >= 0; 0 = only after the last step (and before step 1 if asked)."""
    val_before_train: bool = False
    """Validate the initial actor before step 1 (a resumed run does not redo it)."""
    val_samples_per_problem: int = 0
    """n sampled responses per problem, for sampled pass@1 and pass@n, >= 0; 0 = greedy pass@1 only
    (used only with val_datasets)."""
    val_max_problems: int | None = None
    """Keep only the first N held-out problems, N >= 1; None = all (used only with val_datasets)."""

    # --- ours ---
    loss_impl: str = "auto"
    """The LM-head kernels' impl: auto (triton on CUDA, eager on CPU) | triton | eager."""
    trunk_kernels: str = "auto"
    """The trained models' RMSNorm, residual add, rope and SwiGLU, forward and backward: auto (triton on
    CUDA, eager on CPU) | triton (oreal_fast.kernels.trunk_train) | eager (PyTorch ops, autograd's backward)."""
    attention_backend: str = "auto"
    """The attention of the actor's, reference's and token RM's forwards in the RL phase: auto (by_length on
    CUDA with bf16/fp16, sdpa otherwise) | varlen (torch's flash varlen kernel over the packed row) | sdpa
    (PyTorch's scaled_dot_product_attention per sequence, any device) | cudnn (the same with its cuDNN
    kernel forced, each sequence padded to a multiple of 256 tokens so that cuDNN builds a bounded set of
    graphs) | by_length (cudnn for a micro-batch row whose sequences all have at least 8192 tokens,
    varlen for the others) | by_length_runs (each run of consecutive sequences of at least 8192 tokens in
    a row to cudnn, each run of shorter ones to one varlen call; not yet measured against by_length).
    varlen, cudnn, by_length and by_length_runs need a GPU and dtype bf16, fp16 or auto. On an H100
    cudnn's attention took 8.3 ms to varlen's 12.5 ms at 2 x 16384 tokens (one layer, forward + backward;
    benchmarks/test_bench_attention.py). Generation attends through the rollout engine's own kernels
    whatever this says."""
    loss_kernel: str = "linear_logprob"
    """Actor loss: linear_logprob (fused log-probs, then the loss in PyTorch) | fused_oreal_loss
    (the whole OREAL loss inside the LM-head kernel)."""
    weights_cast_once: bool = True
    """Cast the trained models' matmul weights to the compute dtype once per RL phase, instead of autocast
    casting the fp32 masters in every forward and recompute of every micro-batch; the masters get the same
    gradients bit for bit, and the copies take 2 bytes per cast weight during the phase (~1.7 GB for the
    0.5B actor + RM). Single process only: under torchrun FSDP2 gathers in the compute dtype already, and
    this does nothing; without autocast (fp32 compute, CPU) there is nothing to cast. On by default: with
    merged_projections it runs the RL phase up to 10 % faster on an H100 (benchmarks/RESULTS.md)."""
    merged_projections: bool = True
    """Each block's q/k/v and gate/up projections run as one GEMM each, on one stacked compute-dtype copy
    per group made by weights_cast_once (off with it; True set with weights_cast_once = False is an error);
    the masters, their gradients (to bf16 round-off, not bit for bit) and the checkpoint format are
    unchanged, and the copies take the same bytes as separate ones. Does nothing under torchrun (FSDP2).
    On by default: +9 % RL-loop tokens/s at the short shape on an H100 (benchmarks/RESULTS.md)."""
    gpu_memory_limit_gib: float | None = None
    """Cap on this process's GPU memory in GiB (e.g. 40 to emulate a 40 GB card on a larger one); None = no cap."""
    device: str = "auto"
    """auto (CUDA if available) | cpu | cuda."""
    resume: str | None = None
    """None = fresh run; "auto" = the newest resumable run under work_dir; else a run folder or state file."""
    config_path: str = ""
    """The config file this was loaded from (set by the loader)."""

    def checkpoint_every(self) -> int:
        """Checkpoint interval in steps, resolved as the official trainer does (reference 5.3)."""
        return _resolve_interval(self.checkpoint_interval, self.total_steps)

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python values (for logging and for the run's saved config)."""
        return dataclasses.asdict(self)


def _resolve_interval(value: int | float, total_steps: int) -> int:
    if value == -1:
        return total_steps
    if value < 1:
        return int(total_steps * value)
    return int(value)


# ----------------------------------------------------------------------------- loading


def load_config(path: str, overrides: dict[str, object] | None = None) -> TrainConfig:
    """Runs a config file, applies command-line overrides and validates the result.

    Args:
        path: the config file (a Python module).
        overrides: key -> value, already parsed (e.g. by python-fire); each must be a known key.

    Returns:
        The validated config; reference, rl_global_batch, rm_warmup_steps and the LR floors are
        filled in from their defaults, balance buckets are tuples, datasets a str or list[str].

    Raises:
        ConfigError: naming the key, the file and the allowed range.
    """
    raw = _run_config_file(path)
    overrides = dict(overrides or {})
    raw.update(overrides)
    return _validate(raw, path, set(overrides))


def config_from_values(values: dict[str, object], source: str) -> TrainConfig:
    """Validates settings that come without a config file (``python -m oreal_fast.eval`` with no
    --config); ``source`` stands in for the file's name in error messages, and every key counts as
    set on the command line."""
    return _validate(dict(values), source, set(values))


def _run_config_file(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"config file {path}:{line}: not valid UTF-8 (byte {data[e.start]:#04x})") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot be read ({os.strerror(e.errno) if e.errno else e})") from None
    namespace: dict[str, Any] = {"__file__": path, "__name__": "__oreal_config__"}
    modules_before = set(sys.modules)
    path_before = list(sys.path)
    sys.path[:0] = [folder, os.path.dirname(folder)]
    try:
        exec(compile(source, path, "exec"), namespace)
    except Exception as e:  # any error inside the user's file becomes one line
        line = _error_line(e, path)
        raise ConfigError(f"error while running config {path}{line}: {type(e).__name__}: {e}") from None
    finally:
        sys.path[:] = path_before
        _forget_modules_under(folder, set(sys.modules) - modules_before)
    return {
        k: v for k, v in namespace.items()
        if not k.startswith("_")
        and not isinstance(v, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type))
    }


def _error_line(e: Exception, path: str) -> str:
    if isinstance(e, SyntaxError) and e.lineno:
        return f", line {e.lineno}"
    tb = e.__traceback__
    lineno = None
    while tb is not None:  # the innermost frame that belongs to the config file
        if tb.tb_frame.f_code.co_filename == path:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return f", line {lineno}" if lineno else ""


def _forget_modules_under(folder: str, names: set[str]) -> None:
    """Drops sibling config modules imported while a config ran, so each load starts fresh."""
    root = os.path.join(folder, "")
    for name in names:
        module = sys.modules.get(name)
        files = [getattr(module, "__file__", None) or ""] + list(getattr(module, "__path__", []) or [])
        if any(os.path.join(os.path.abspath(f), "").startswith(root) for f in files if f):
            del sys.modules[name]


# ----------------------------------------------------------------------------- validation


class _Checker:
    """Builds error messages that name key, file and (when set there) the command line."""

    def __init__(self, path: str, overridden: set[str]):
        self.path = path
        self.overridden = overridden

    def fail(self, key: str, why: str) -> typing.NoReturn:
        where = " (set on the command line)" if key in self.overridden else ""
        raise ConfigError(f"{key} in {self.path}{where}: {why}")


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _validate(raw: dict[str, Any], path: str, overridden: set[str]) -> TrainConfig:
    c = _Checker(path, overridden)
    for key in raw:
        if key not in _FIELDS or key == "config_path":
            close = difflib.get_close_matches(key, list(_FIELDS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            c.fail(key, f"unknown key{hint}")
    for key in ("actor", "datasets"):
        if key not in raw:
            c.fail(key, "missing; every config must set it")
    values = dict(raw)
    for key, other in DEFAULTS_FROM.items():
        if values.get(key) is None and other in values:
            values[key] = values[other]
    hints = typing.get_type_hints(TrainConfig)
    for key, value in values.items():
        values[key] = _check_type(c, key, value, hints[key])
    cfg = TrainConfig(**values, config_path=path)
    for key, other in DEFAULTS_FROM.items():  # when the source key was absent too
        if getattr(cfg, key) is None:
            setattr(cfg, key, getattr(cfg, other))
    _check_ranges(c, cfg)
    _check_choices(c, cfg)
    _check_rollout_engine(c, cfg)
    _check_combinations(c, cfg)
    if raw.get("merged_projections") is True and not cfg.weights_cast_once:  # the default follows weights_cast_once
        c.fail("merged_projections", "True needs weights_cast_once = True (the merged GEMMs run on its copies)")
    _check_checkpoints(c, cfg)
    _check_device(c, cfg)
    _check_validation(c, cfg)
    _check_judgers(c, cfg)
    _check_reward_fn(c, cfg)
    _check_data_sources(c, cfg)
    return cfg


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def _check_type(c: _Checker, key: str, value: Any, hint: Any) -> Any:
    """Checks one value against its field type; returns it normalised (int -> float, tuples)."""
    if key == "datasets":
        return _check_datasets(c, value)
    if key == "val_datasets":
        return None if value is None else _check_datasets(c, value, key)
    if key == "data_difficulty_balance_cfg":
        return _check_buckets(c, value)
    if key == "report_to":
        return _check_report_to(c, value)
    if key in ("judgers_config", "data_judger_mapping"):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            c.fail(key, f"must be a dict with str keys, got {type(value).__name__}")
        return dict(value)
    options = typing.get_args(hint) if typing.get_origin(hint) in (types.UnionType, typing.Union) else (hint,)
    if value is None and type(None) in options:
        return None
    for t in options:
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return value if isinstance(value, int) and int in options else float(value)
        if t is str and isinstance(value, str):
            return value
    allowed = " or ".join(_type_name(t) if t is not type(None) else "None" for t in options)
    c.fail(key, f"expected {allowed}, got {type(value).__name__} {value!r}")


def _check_datasets(c: _Checker, value: Any, key: str = "datasets") -> str | dict | list[str | dict]:
    from oreal_fast.data.sources import check_sources

    try:
        check_sources(value)
    except ValueError as e:
        c.fail(key, str(e))
    return list(value) if isinstance(value, tuple) else value


def _check_report_to(c: _Checker, value: Any) -> list[str]:
    from oreal_fast.tracking import check_report_to

    try:
        return check_report_to(value)
    except ValueError as e:
        c.fail("report_to", str(e))


def _check_buckets(c: _Checker, value: Any) -> list[tuple[tuple[float, float], int]] | None:
    if value is None:
        return None
    key = "data_difficulty_balance_cfg"
    if not isinstance(value, (list, tuple)):
        c.fail(key, f"expected a list of ((low, high), copies) or None, got {type(value).__name__}")
    buckets = []
    for i, bucket in enumerate(value):
        try:
            (low, high), copies = bucket
        except (TypeError, ValueError):
            c.fail(key, f"entry {i} is {bucket!r}; expected ((low, high), copies)")
        numbers_ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (low, high))
        if not numbers_ok or not low < high:
            c.fail(key, f"entry {i}: bounds {(low, high)!r} must be numbers with low < high")
        if not isinstance(copies, int) or isinstance(copies, bool) or copies < 0:
            c.fail(key, f"entry {i}: copies {copies!r} must be an int >= 0")
        buckets.append(((float(low), float(high)), copies))
    return buckets


def _check_ranges(c: _Checker, cfg: TrainConfig) -> None:
    for key, low in AT_LEAST.items():
        if getattr(cfg, key) < low:
            c.fail(key, f"must be an int >= {low}, got {getattr(cfg, key)}")
    if cfg.seed >= 2**32:
        c.fail("seed", f"must be < 2**32 (numpy seeds are 32-bit), got {cfg.seed}")
    if cfg.max_prompts is not None and cfg.max_prompts < 1:
        c.fail("max_prompts", f"must be None or an int >= 1, got {cfg.max_prompts}")
    for key in ("actor_lr", "actor_min_lr", "token_level_rm_lr", "token_level_rm_lr_min", "wd",
                "kl_coef", "positive_loss_factor", "negative_loss_factor"):
        value = getattr(cfg, key)
        if not math.isfinite(value) or value < 0:
            c.fail(key, f"must be a finite float >= 0, got {value}")
    _in_range(c, cfg, "selective_recompute", 0.0, 1.0, "None or [0, 1]", lambda v, lo, hi: v is None or lo <= v <= hi)
    _in_range(c, cfg, "gen_top_p", 0.0, 1.0, "(0, 1]", lambda v, lo, hi: lo < v <= hi)
    _in_range(c, cfg, "correct_threshold", 0.0, 1.0, "[0, 1)", lambda v, lo, hi: lo <= v < hi)
    _in_range(c, cfg, "incorrect_threshold", 0.0, 1.0, "[0, 1)", lambda v, lo, hi: lo <= v < hi)
    # K = int(R * ratio) can still be 0 for short responses; the token-weight code handles that.
    _in_range(c, cfg, "correct_topk_ratio", 0.0, 1.0, "(0, 1]", lambda v, lo, hi: lo < v <= hi)
    _in_range(c, cfg, "incorrect_topk_ratio", 0.0, 1.0, "(0, 1]", lambda v, lo, hi: lo < v <= hi)
    if not cfg.temperature > 0 or not math.isfinite(cfg.temperature):
        c.fail("temperature", f"must be a finite float > 0, got {cfg.temperature}")
    if not cfg.max_grad_norm > 0:
        c.fail("max_grad_norm", f"must be > 0, got {cfg.max_grad_norm}")


def _check_choices(c: _Checker, cfg: TrainConfig) -> None:
    """Named options, non-empty names, local model paths that exist, what is not implemented."""
    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            c.fail(key, f"must be one of {', '.join(allowed)}; got {getattr(cfg, key)!r}")
    for key in ("actor", "reference", "stop_word", "work_dir"):
        if not getattr(cfg, key):
            c.fail(key, "must be a non-empty str")
    for key in ("actor", "reference", "token_level_rm"):
        ref = getattr(cfg, key)
        if ref is not None and _looks_like_path(ref) and not os.path.exists(os.path.expanduser(ref)):
            c.fail(key, f"the local path {ref!r} does not exist")
    if cfg.cpu_offload:
        c.fail("cpu_offload", "CPU offload (an FSDP feature of the official trainer) is not implemented here; "
               "set it to False")


def _looks_like_path(ref: str) -> bool:
    """A model ref that can only be a local path: a hub id is ``org/name``, a package ref ``package://``."""
    if "://" in ref:
        return False
    return ref.startswith(("/", "./", "../", "~")) or ref.endswith(".gguf") or ref.count("/") > 1


def _check_rollout_engine(c: _Checker, cfg: TrainConfig) -> None:
    if cfg.kv_cache_gib is not None and not (math.isfinite(cfg.kv_cache_gib) and cfg.kv_cache_gib > 0):
        c.fail("kv_cache_gib", f"must be None or a finite float > 0 (GiB), got {cfg.kv_cache_gib}")
    _in_range(c, cfg, "kv_cache_memory_fraction", 0.0, 1.0, "(0, 1]", lambda v, lo, hi: lo < v <= hi)


def _in_range(c: _Checker, cfg: TrainConfig, key: str, lo: float, hi: float, text: str, ok) -> None:
    if not ok(getattr(cfg, key), lo, hi):
        c.fail(key, f"must be in {text}, got {getattr(cfg, key)}")


def _check_combinations(c: _Checker, cfg: TrainConfig) -> None:
    if cfg.gen_global_batch % cfg.prompt_repeat_k:
        c.fail("gen_global_batch", f"{cfg.gen_global_batch} is not divisible by prompt_repeat_k = "
               f"{cfg.prompt_repeat_k}; it must be prompts per step x prompt_repeat_k")
    if cfg.gen_max_new >= cfg.gen_max_length:
        c.fail("gen_max_new", f"{cfg.gen_max_new} must be < gen_max_length = {cfg.gen_max_length} "
               "(the prompt needs room too)")
    if cfg.actor_min_lr > cfg.actor_lr:
        c.fail("actor_min_lr", f"{cfg.actor_min_lr} is above the peak actor_lr = {cfg.actor_lr}")
    if cfg.token_level_rm_lr_min > cfg.token_level_rm_lr:
        c.fail("token_level_rm_lr_min",
               f"{cfg.token_level_rm_lr_min} is above the peak token_level_rm_lr = {cfg.token_level_rm_lr}")
    # The cosine phase runs the steps after the actor's warmup_steps, each model with T_max = total_steps
    # - its warmup, and T_max <= 0 divides by zero (reference 4.13). A run that ends within the actor's
    # warmup never reaches it (the official trainer too): `--total_steps 1` is a valid smoke run.
    if cfg.warmup_steps < cfg.total_steps - 1 and cfg.rm_warmup_steps >= cfg.total_steps:
        c.fail("rm_warmup_steps", f"{cfg.rm_warmup_steps} must be < total_steps = {cfg.total_steps}: the cosine "
               f"phase starts after warmup_steps = {cfg.warmup_steps}")
    if cfg.token_level_rm is not None:
        if not cfg.threshold_rescale and not cfg.topk_rescale:
            c.fail("token_level_rm", "a token-level RM is set but threshold_rescale and topk_rescale "
                   "are both False; set exactly one to True (or token_level_rm = None)")
        if cfg.threshold_rescale and cfg.topk_rescale:
            c.fail("topk_rescale", "threshold_rescale and topk_rescale are both True; set exactly one "
                   "(the official trainer would silently ignore topk_rescale)")


def _check_checkpoints(c: _Checker, cfg: TrainConfig) -> None:
    interval = cfg.checkpoint_interval
    if not (interval == -1 or 0 < interval):
        c.fail("checkpoint_interval", f"must be -1, in (0, 1) or >= 1; got {interval}")
    if cfg.checkpoint_every() < 1:
        c.fail("checkpoint_interval", f"{interval} x total_steps {cfg.total_steps} rounds down to 0 "
               f"steps; use a fraction >= {1 / cfg.total_steps:.4g}, an int >= 1 or -1")
    if cfg.resume not in (None, "auto") and not os.path.exists(cfg.resume):
        c.fail("resume", f"{cfg.resume!r} does not exist (use None, 'auto', a run folder or a state file)")


def _check_device(c: _Checker, cfg: TrainConfig) -> None:
    """What the device can run: CUDA present when named, low-precision dtypes and a memory cap on a GPU only."""
    import torch  # only here: loading a config must not wait for torch unless it checks a device

    if cfg.device == "cuda" and not torch.cuda.is_available():
        c.fail("device", "'cuda' was asked for but no CUDA device is available (use 'auto' or 'cpu')")
    on_cpu = cfg.device == "cpu" or not torch.cuda.is_available()
    if on_cpu and cfg.dtype in ("bf16", "fp16"):
        c.fail("dtype", f"{cfg.dtype!r} needs a GPU; on CPU use 'fp32' or 'auto' (which picks fp32 there)")
    if cfg.attention_backend in ("varlen", "cudnn", "by_length", "by_length_runs") and (
            on_cpu or cfg.dtype == "fp32"):
        where = "the run is on CPU" if on_cpu else "dtype is 'fp32'"
        c.fail("attention_backend", f"{cfg.attention_backend!r} needs a GPU and bf16/fp16 compute, but {where} "
               f"(use 'auto' or 'sdpa')")
    for key in ("loss_impl", "trunk_kernels"):
        if on_cpu and getattr(cfg, key) == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
            c.fail(key, "'triton' on CPU runs the Triton kernels in their interpreter: set "
                   "TRITON_INTERPRET=1, or use 'eager' or 'auto'")
    if cfg.gpu_memory_limit_gib is not None:
        if on_cpu:
            c.fail("gpu_memory_limit_gib", "caps GPU memory, but the run is on CPU (set it to None)")
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        if not 0 < cfg.gpu_memory_limit_gib <= total:
            c.fail("gpu_memory_limit_gib", f"must be in (0, {total:.1f}] GiB (this GPU's memory), "
                   f"got {cfg.gpu_memory_limit_gib}")


def _check_validation(c: _Checker, cfg: TrainConfig) -> None:
    if cfg.val_max_problems is not None and cfg.val_max_problems < 1:
        c.fail("val_max_problems", f"must be None or an int >= 1, got {cfg.val_max_problems}")
    # asking for a validation without problems would silently do nothing (the sample count and the
    # problem cap only say how to validate: like rl_global_batch, unused when there is nothing to do);
    # but --val_datasets None on the command line turns a config's validation off as a whole: the
    # file's requests are reset to off, so that the resolved config says (and reloads to) what runs
    off_on_command_line = "val_datasets" in c.overridden
    for key, asked in (("val_interval", cfg.val_interval > 0), ("val_before_train", cfg.val_before_train)):
        if not asked or cfg.val_datasets is not None:
            continue
        if off_on_command_line and key not in c.overridden:
            setattr(cfg, key, _FIELDS[key].default)
        else:
            c.fail(key, f"{getattr(cfg, key)!r} asks for validation but val_datasets is None "
                   f"(set val_datasets, or {key} = {_FIELDS[key].default!r})")


def _check_judgers(c: _Checker, cfg: TrainConfig) -> None:
    from oreal_fast.judge.settings import parse_judger_settings

    for name, raw in cfg.judgers_config.items():
        if not isinstance(raw, dict):
            c.fail("judgers_config", f"entry {name!r} must be a dict of settings, got {type(raw).__name__}")
        try:
            parse_judger_settings(name, raw)
        except ValueError as e:
            c.fail("judgers_config", str(e))
    for source, names in cfg.data_judger_mapping.items():
        if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
            c.fail("data_judger_mapping", f"{source!r} must map to a non-empty list of judger names")
        missing = [n for n in names if n not in cfg.judgers_config]
        if missing:
            c.fail("data_judger_mapping", f"{source!r} names judger(s) {missing} that judgers_config does "
                   f"not define (defined: {sorted(cfg.judgers_config)})")
        cfg.data_judger_mapping[source] = list(names)


def _check_reward_fn(c: _Checker, cfg: TrainConfig) -> None:
    """The reward function loads here, before any model does, and takes (record, response, gold_answer);
    a file path is stored absolute."""
    from oreal_fast.judge.reward_fn import check_reward_fn

    if cfg.reward_fn is None:
        return
    try:
        cfg.reward_fn = check_reward_fn(cfg.reward_fn)
    except ValueError as e:
        c.fail("reward_fn", str(e))


def _check_data_sources(c: _Checker, cfg: TrainConfig) -> None:
    """Every source's data_source has a judger; balancing is not asked of problems without pass rates."""
    from oreal_fast.data.sources import GymSource, parse_sources

    for key in ("datasets", "val_datasets"):
        sources = parse_sources(getattr(cfg, key)) if getattr(cfg, key) is not None else []
        for source in sources:
            if source.data_source not in cfg.data_judger_mapping:
                c.fail("data_judger_mapping", f"has no entry for data_source {source.data_source!r}, which {key} "
                       f"uses (mapped: {sorted(cfg.data_judger_mapping)})")
    if cfg.data_difficulty_balance_cfg and any(isinstance(s, GymSource) for s in parse_sources(cfg.datasets)):
        c.fail("data_difficulty_balance_cfg", "datasets has reasoning_gym problems, which have no pass_rate to "
               "balance on; set data_difficulty_balance_cfg = None")


def compatibility_notes(cfg: TrainConfig) -> list[str]:
    """One line per official key set to a value that would matter in the official trainer but has no
    effect here (see COMPATIBILITY_ONLY); the trainer logs them at start."""
    notes = []
    for key, (inert, what) in COMPATIBILITY_ONLY.items():
        value = getattr(cfg, key)
        if key == "rl_global_batch":  # read only without the filter, and a no-op when it is the whole batch
            matters = not cfg.filter_trajectory and value != cfg.gen_global_batch
        else:
            matters = value != inert
        if matters:
            notes.append(f"accepted for compatibility, has no effect here: {key} = {value!r} ({what})")
    return notes


def validate_stop_word(cfg: TrainConfig, tokenizer: Any) -> int:
    """Checks that ``cfg.stop_word`` is exactly one token of ``tokenizer``.

    Args:
        cfg: the loaded config.
        tokenizer: the actor's tokenizer (a transformers tokenizer).

    Returns:
        The stop token id.

    Raises:
        ConfigError: when the stop word encodes to zero or several tokens.
    """
    ids = tokenizer.encode(cfg.stop_word, add_special_tokens=False)
    if len(ids) != 1:
        _Checker(cfg.config_path, set()).fail(
            "stop_word", f"{cfg.stop_word!r} encodes to {len(ids)} tokens {ids} with the tokenizer of "
            f"{cfg.actor!r}; it must be exactly one token (a special token such as '<|im_end|>')")
    return ids[0]
