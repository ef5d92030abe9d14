"""Fixtures for step-loop tests: a byte-level tokenizer with ChatML markers, a tiny random Qwen2
checkpoint folder, a prompt file, and scripted rollout / judger stand-ins."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

CHATML = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def make_tokenizer():
    """Byte-level BPE with no merges (every byte one token) plus ChatML specials: 259 ids."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML)


def save_random_qwen2(folder, seed: int, **sizes) -> str:
    """A random-init Qwen2 (2 layers, GQA 4/2, qkv bias, tied, the byte tokenizer's 272 ids) saved as
    an HF folder with its tokenizer; ``sizes`` override Qwen2Config fields (hidden_size, ...)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    fields = dict(vocab_size=272, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, rope_theta=10000.0)
    Qwen2ForCausalLM(Qwen2Config(**{**fields, **sizes})).save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return str(folder)


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


@dataclass
class ScriptedRollout:
    """Answers each prompt with a text of ``texts`` drawn with the run's sampling generator (so a
    resumed run draws what a straight run would), encoded, stop token appended.

    ``fail_at_call``: raise on that call (0-based), to stand in for a crash mid-run.
    """

    tokenizer: object
    texts: list[str]
    stop_token_id: int
    fail_at_call: int | None = None
    calls: int = 0

    def generate(self, prompts, params, generator):
        if self.calls == self.fail_at_call:
            raise RuntimeError("scripted crash")
        self.calls += 1
        picks = torch.randint(len(self.texts), (len(prompts),), generator=generator).tolist()
        out = []
        for i in picks:
            ids = self.tokenizer.encode(self.texts[i], add_special_tokens=False)[: params.max_new_tokens - 1]
            out.append(ids + [self.stop_token_id])
        return out

    def sync_weights(self, weights):
        pass  # scripted texts do not depend on the weights

    def stats(self):
        return {}


class KeywordRouter:
    """Reward +1 iff the response contains ``keyword``; stateless, like a real judger."""

    def __init__(self, keyword: str = "yes"):
        self.keyword = keyword

    def judge(self, items):
        from oreal_fast.judge import JudgeOutcome

        rewards = [1.0 if self.keyword in it.response_text else -1.0 for it in items]
        return JudgeOutcome(rewards=rewards, counters={"rule_confirmed": sum(r > 0 for r in rewards)})

    def live_workers(self):
        return 0  # no worker processes

    def close(self):
        pass


class ScriptedRouter:
    """Returns the next rewards of ``pattern`` (cycled) for each item."""

    def __init__(self, pattern: list[float]):
        self.pattern = pattern
        self.seen = 0

    def judge(self, items):
        from oreal_fast.judge import JudgeOutcome

        rewards = [self.pattern[(self.seen + i) % len(self.pattern)] for i in range(len(items))]
        self.seen += len(items)
        return JudgeOutcome(rewards=rewards, counters={"rule_confirmed": sum(r > 0 for r in rewards)})

    def live_workers(self):
        return 0  # no worker processes

    def close(self):
        pass

