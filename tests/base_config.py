"""The repository root and a small valid config text, shared by the config and evaluator tests."""

import os
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A small valid config; each bad case of the config tests appends one line to it.
BASE = textwrap.dedent("""
    actor = "some/model"
    token_level_rm = actor
    datasets = "package://oreal_fast/assets/demo_problems.jsonl"
    threshold_rescale = True
    gen_global_batch = 16
    prompt_repeat_k = 4
    gen_max_new = 64
    gen_max_length = 256
    total_steps = 4
    warmup_steps = 1
    actor_freeze_steps = 1
    checkpoint_interval = 2
    judgers_config = dict(math_judger=dict(hosts=[], rule_only=True))
""")
