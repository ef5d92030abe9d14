"""Stand-ins and builders the step-loop tests share: a byte-level tokenizer with ChatML markers, a tiny
random Qwen2 checkpoint folder, scripted rollout and judgers, and the small config the tests write.

Plain functions and classes, imported by the test files; the pytest fixtures built on them live in
``conftest.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

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


K = 4
REWARDS = [1.0, -1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0]  # group 0 mixed (c = 2), group 1 all wrong
TEXTS = ["1 + 1 = 2, so \\boxed{2}", "It is 3.", "maybe 7", "The answer is 2",
         "No idea", "4?", "five", "\\boxed{9}"]
KL_COEF, ALPHA, BETA = 0.05, 1.0, 0.5


def write_config(tmp_path, actor: str, reference: str, prompt_file: str, **extra) -> str:
    fields = dict(
        actor=actor, reference=reference, token_level_rm=reference, datasets=prompt_file,
        stop_word="<|im_end|>", dtype="fp32", device="cpu", loss_impl="eager",
        data_difficulty_balance_cfg=None, gen_global_batch=2 * K, prompt_repeat_k=K,
        gen_max_new=40, gen_max_length=160, rl_mirco_batch=2, filter_trajectory=True,
        warmup_steps=1, total_steps=4, actor_freeze_steps=0, actor_lr=1e-3, actor_min_lr=1e-4,
        token_level_rm_lr=1e-3, token_level_rm_lr_min=1e-4, threshold_rescale=True,
        correct_threshold=0.5, incorrect_threshold=0.5, reward_shaping_type="rloo",
        positive_loss_factor=ALPHA, negative_loss_factor=BETA, pos_mult_adv=True, kl_coef=KL_COEF,
        kl_type="unbias", work_dir=str(tmp_path / "work"), checkpoint_interval=2, seed=0, debug=True,
        judgers_config={"math_judger": {"hosts": [], "stop_word": "<|im_end|>", "rule_only": True}},
        data_judger_mapping={"math": ["math_judger"]},
    )
    fields.update(extra)
    path = tmp_path / "cfg.py"
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in fields.items()))
    return str(path)


class TextRollout:
    """What a rollout stand-in whose texts depend on neither the weights nor memory does between
    its `generate` calls: nothing (a subclass with a model distribution overrides `response_logprobs`)."""

    def sync_weights(self, weights):
        pass  # the texts do not depend on the weights

    def response_logprobs(self):
        return None  # the texts come from no model distribution

    def fit_memory(self, peak_gib):
        pass  # nothing here is sized from memory

    def memory_state(self):
        return {}

    def load_memory_state(self, state):
        pass

    def stats(self):
        return {}


@dataclass
class ScriptedRollout(TextRollout):
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
