"""A config's reward_fn scores a training step: the trainer's own judge pool calls it, its rewards
are the step's, and they drive the one-pair filter and the advantages."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from oreal_fast.config import load_config
from oreal_fast.trainer import Trainer

from trainer_helpers import K, TEXTS, ScriptedRollout, make_tokenizer, write_config

E = "<|im_end|>"
# reward per scripted response text: floats of both signs and a bool, none of them -1
SCORES = {t: s for t, s in zip(TEXTS, [0.5, -0.25, False, 2.0, -0.75, True, 0.125, -0.5])}


def _as_reward(score: float | bool) -> float:
    """A bool is a verdict (+1 / -1), a number the reward as is."""
    return (1.0 if score else -1.0) if isinstance(score, bool) else float(score)


def test_reward_fn_drives_the_rewards_of_a_step(tmp_path, tiny_model_dir, prompt_file):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(textwrap.dedent(f"""
        SCORES = {{text + {E!r}: score for text, score in {SCORES!r}.items()}}

        def reward(record, response, gold_answer):
            # the record is the prompt's: its question and gold answer, and the fields it has besides
            assert record["gold_answer"] == gold_answer and record["question"].startswith("What is")
            assert record["data_source"] == "math" and record["pass_rate"] == 0.25
            return SCORES[response]
    """))
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file,
                                   reward_fn=f"{reward_file}:reward", filter_trajectory=False))
    tok = make_tokenizer()
    trainer = Trainer(cfg, rollout=ScriptedRollout(tok, TEXTS, tok.convert_tokens_to_ids(E)))
    judged = []
    judge = trainer.judge
    trainer.judge = lambda samples: judged.append(judge(samples)) or judged[-1]
    try:
        metrics = trainer.step(0)
    finally:
        trainer.router.close()

    (samples,) = judged
    expected = [_as_reward(SCORES[t.removesuffix(E)]) for t in samples.texts]
    assert samples.rewards == expected
    assert metrics["avg_judger_reward"] == pytest.approx(sum(expected) / len(expected))
    assert (metrics["judger_reward_fn_errors"], metrics["judger_reward_fn_timeouts"],
            metrics["judger_reward_fn_bad_returns"]) == (0, 0, 0)
    # every sample trained (no filter), with the function's reward and the RLOO advantage of it
    with open(os.path.join(trainer.run_dir, "trajectories", "step.0.jsonl")) as f:
        dumped = [json.loads(line) for line in f]
    assert [t["judger_reward"] for t in dumped] == expected
    for g in range(0, len(expected), K):
        group = expected[g:g + K]
        for i, r in enumerate(group):
            rloo = r - (sum(group) - r) / (K - 1)
            assert dumped[g + i]["judger_advantage"] == pytest.approx(rloo, rel=1e-6)
