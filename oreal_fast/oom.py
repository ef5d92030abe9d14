"""A step that runs out of GPU memory ends with one line that says where and what would fit it.

``torch.OutOfMemoryError`` names the bytes it failed to allocate and little else. The trainer turns
it into :class:`StepOutOfMemory`, which names the phase it happened in (generate, judge, rl,
checkpoint, validate), the peak allocated memory of the step so far, the cap
(``gpu_memory_limit_gib`` or the card), and the config keys that would make that phase fit. The
command line prints it with the resume state on disk and the command that continues the run.

What this module does not do: recover. The paged engine preempts and recomputes sequences when
its KV pool is full (that never allocates); memory beyond the pool is activations and the
optimiser, which only a smaller setting shrinks. Invariant: nothing is written after the error:
a checkpoint is either complete and verified, or absent (``run_dir``'s atomic writes), so the last
verified state stays the resume point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line imports this module before torch is needed
    import torch

# What would make each phase fit, most effective first. Without kv_cache_gib the KV pool starts at
# kv_cache_memory_fraction of the free memory and is then sized from the measured steps
# (rollout/engine/pool_sizing.py); its size is in every step's metrics.
POOL = ("a kv_cache_gib below the logged rollout_kv_pool_gib (a fixed KV pool; unset, the pool starts at "
        "kv_cache_memory_fraction, then follows the measured steps)")
KNOBS = {
    "start": ("a higher gpu_memory_limit_gib or a larger card",
              "a smaller kv_cache_gib or kv_cache_memory_fraction (the KV pool at start)",
              "a smaller max_num_seqs (the engine's buffers and CUDA graphs)"),
    "generate": (POOL, "a smaller max_num_seqs", "a smaller max_prefill_tokens", "a smaller gen_max_length"),
    "validate": (POOL, "a smaller max_num_seqs", "a smaller max_prefill_tokens", "a smaller val_samples_per_problem"),
    "rl": ("a smaller rl_micro_batch_tokens (tokens per micro-batch)",
           "selective_recompute up to 1.0 (recompute every block)",
           "a kv_cache_gib below the logged rollout_kv_pool_gib (the KV pool stays allocated while the RL phase "
           "runs)", "rollout_keep_cache False"),
    "checkpoint": ("keep_resume_states 0", "a smaller rl_micro_batch_tokens"),
}
DEFAULT_KNOBS = ("a smaller rl_micro_batch_tokens", POOL, "a higher gpu_memory_limit_gib")


class StepOutOfMemory(RuntimeError):
    """The GPU ran out of memory in one phase of a step.

    Attributes:
        phase: the phase it happened in (the trainer's phase names).
        step: the 1-based step, or None at start-up (loading models, building the engine).
        resume_dir: the run folder ``--resume`` continues, or None when no state is on disk (set
            by the trainer on the way up).
    """

    def __init__(self, message: str, phase: str, step: int | None) -> None:
        super().__init__(message)
        self.phase = phase
        self.step = step
        self.resume_dir: str | None = None


def explain(error: torch.OutOfMemoryError, *, phase: str, step: int | None, device: torch.device,
            cap_gib: float | None) -> StepOutOfMemory:
    """The one-line account of ``error`` (see the module docstring)."""
    import torch

    first_line = str(error).splitlines()[0] if str(error) else "CUDA out of memory"
    if device.type == "cuda":
        # the trainer resets the peak at each phase boundary: this is the failing phase's peak
        peak = f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated in this phase"
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        cap = f"{cap_gib:g} GiB (gpu_memory_limit_gib)" if cap_gib is not None else f"{total:.1f} GiB (the card)"
    else:
        peak, cap = "not measured off CUDA", "none"
    knobs = "; ".join(KNOBS.get(phase, DEFAULT_KNOBS))
    where = f"in step {step}, phase {phase}" if step is not None else "at start-up"
    message = f"out of GPU memory {where}: peak {peak}, cap {cap} ({first_line}); to fit, try: {knobs}"
    return StepOutOfMemory(message, phase, step)
