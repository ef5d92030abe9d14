"""Selective activation recompute, applied to a model from outside (as FSDP would be).

``apply_selective_recompute(model, ratio)`` wraps the first ``round(ratio * num_layers)`` decoder
blocks so that their activations are dropped after the forward and recomputed in the backward.
The official trainer recomputes every layer (xtuner's ``recompute_ratio`` 1.0); the config key
``selective_recompute`` sets the ratio. Memory then grows with one block's activations plus the
block inputs, instead of with all blocks' activations.

Invariant: parameter names and the state dict are unchanged (the wrapper strips its own prefix),
so checkpoints and the HF name map do not see it.
"""

from __future__ import annotations

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from oreal_fast.model.decoder import Decoder


def apply_selective_recompute(model: Decoder, ratio: float) -> int:
    """Wraps the first ``round(ratio * num_layers)`` blocks of ``model`` in place.

    Args:
        model: a Decoder (for a token RM, pass its ``backbone``).
        ratio: share of blocks to recompute, in [0, 1].

    Returns:
        The number of blocks wrapped.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"selective_recompute must be in [0, 1], got {ratio}")
    num = round(ratio * len(model.blocks))
    for i in range(num):
        # preserve_rng_state=False as the official wrapper: the blocks have no dropout
        model.blocks[i] = checkpoint_wrapper(model.blocks[i], preserve_rng_state=False)
    return num

