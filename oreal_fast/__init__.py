"""oreal-fast: a fast trainer for OREAL that reproduces the official trainer's outer loop exactly.

Subpackages: ``data`` (prompts, balancing, sampler, packing), ``model`` (packed decoder, HF I/O,
token-level reward model), ``rollout`` (generation), ``judge`` (rule + LLM verifiers), ``algo``
(pure OREAL math), ``kernels`` (Triton LM-head kernels and their eager twins).
"""

__version__ = "0.1.0"
