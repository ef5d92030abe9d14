"""Triton kernels of oreal-fast, installed as ``oreal_fast.kernels`` (never as a top-level ``kernels``).

Every kernel has an eager PyTorch twin with the same signature (``impl="eager"``): the CPU path,
the test oracle and the trainer's ``loss_impl="eager"`` switch. What the families share
(constants, the ``impl`` check, tile choice, argument checks) lives in ``common``.
"""

from oreal_fast.kernels.common import IGNORE_INDEX
from oreal_fast.kernels.decode_tail import decode_slots, decode_slots_eager, decode_tail, decode_tail_eager
from oreal_fast.kernels.decode_gemv import (add_rms_norm_partials, add_rms_norm_partials_eager, linear_partials,
                                            linear_partials_eager, norm_linear, norm_linear_eager,
                                            norm_linear_rope_kv, norm_linear_rope_kv_eager)
from oreal_fast.kernels.linear_logprob import linear_logprob, linear_logprob_eager
from oreal_fast.kernels.fused_oreal_loss import fused_oreal_loss, fused_oreal_loss_eager
from oreal_fast.kernels.paged_attention import paged_decode_attention, paged_decode_attention_eager
from oreal_fast.kernels.skinny_gemm import skinny_linear, skinny_linear_eager
from oreal_fast.kernels.sampling import (sample_from_logits, sample_from_logits_eager, sample_with_logprobs,
                                        sample_with_logprobs_eager, token_logprobs, token_logprobs_eager)
from oreal_fast.kernels.trunk_inference import (add_rms_norm, add_rms_norm_eager, rope_write_kv, rope_write_kv_eager,
                                                silu_mul, silu_mul_eager)

__all__ = ["IGNORE_INDEX", "add_rms_norm", "add_rms_norm_eager", "add_rms_norm_partials",
           "add_rms_norm_partials_eager", "decode_slots", "decode_slots_eager", "decode_tail",
           "decode_tail_eager", "fused_oreal_loss", "fused_oreal_loss_eager", "linear_logprob",
           "linear_logprob_eager", "linear_partials", "linear_partials_eager", "norm_linear", "norm_linear_eager",
           "norm_linear_rope_kv", "norm_linear_rope_kv_eager", "paged_decode_attention",
           "paged_decode_attention_eager", "rope_write_kv", "rope_write_kv_eager",
           "sample_from_logits", "sample_from_logits_eager", "sample_with_logprobs", "sample_with_logprobs_eager",
           "silu_mul", "silu_mul_eager", "skinny_linear", "skinny_linear_eager", "token_logprobs",
           "token_logprobs_eager"]
