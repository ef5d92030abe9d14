"""Triton kernels of oreal-fast, installed as ``oreal_fast.kernels`` (never as a top-level ``kernels``)."""
