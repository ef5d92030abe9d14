"""Fixtures for step-loop tests: a tiny random Qwen2 checkpoint folder (and a perturbed copy as actor)
and a prompt file; the helpers they use are in ``trainer_helpers``."""

from __future__ import annotations

import json

import pytest
import torch

from trainer_helpers import make_tokenizer, save_random_qwen2


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """`save_random_qwen2` at H=32."""
    return save_random_qwen2(tmp_path_factory.mktemp("tiny_qwen2"), 1234)


@pytest.fixture
def perturbed_actor_dir(tiny_model_dir, tmp_path) -> str:
    """The tiny model with every weight moved a little, so actor != reference and the KL is not 0."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    folder = tmp_path / "actor"
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture
def prompt_file(tmp_path) -> str:
    """Eight problems with pass rates in the balanced buckets."""
    path = tmp_path / "problems.jsonl"
    rows = [{"question": f"What is {a} + {a}?", "gold_answer": str(2 * a), "pass_rate": 0.25}
            for a in range(1, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
