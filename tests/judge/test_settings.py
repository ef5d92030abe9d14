"""judgers_config entries: defaults, official keys, and one clear message per bad entry."""

import pytest

from oreal_fast.judge import parse_judger_settings
from oreal_fast.judge.settings import DEFAULT_VERIFY_PROMPT

OFFICIAL_ENTRY = {  # the official 7B config's math_judger entry
    "hosts": ["10.0.0.1:10003", "10.0.0.2:10003"],
    "stop_word": "<|im_end|>",
    "thinking_finish_words": ["<conclude>", "**Final Answer**", "</think>"],
    "num_processes": 8,
    "concurrency_per_proc": (8, 8),
}


def test_official_entry_parses_with_official_behaviour():
    s = parse_judger_settings("math_judger", OFFICIAL_ENTRY)
    assert s.hosts == ("10.0.0.1:10003", "10.0.0.2:10003")
    assert s.thinking_finish_words == ("<conclude>", "**Final Answer**", "</think>")
    assert (s.rule_mode, s.rule_only, s.accept_correct_incorrect) == ("official", False, False)
    assert s.max_concurrency == 8 * 8  # num_processes x stage-1 threads, as the official ran


def test_rule_only_needs_no_host():
    s = parse_judger_settings("math_judger", {"rule_only": True, "rule_mode": "strict"})
    assert (s.hosts, s.rule_mode) == ((), "strict")


def test_default_prompt_has_the_three_fields():
    text = DEFAULT_VERIFY_PROMPT.format(question="QQ", gold_answer="GG", answer="AA")
    assert text.index("QQ") < text.index("GG") < text.index("AA")
    assert "A" in text and "B" in text and "{" in text  # literal \boxed{} survives formatting


def test_none_prompt_means_default():
    s = parse_judger_settings("j", {"rule_only": True, "verify_prompt": None})
    assert s.verify_prompt == DEFAULT_VERIFY_PROMPT


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"rule_only": True, "hostz": []}, "judgers_config.j.hostz: unknown key"),
        ({"hosts": "a:1"}, "judgers_config.j.hosts: expected a list of strings"),
        ({"hosts": ["https://a:1"]}, "judgers_config.j.hosts: expected host:port"),
        ({}, "judgers_config.j.hosts: no verifier host given"),
        ({"rule_only": True, "rule_mode": "lenient"}, "judgers_config.j.rule_mode: expected one of"),
        ({"rule_only": 1}, "judgers_config.j.rule_only: expected bool"),
        ({"rule_only": True, "rule_timeout_s": 0}, "judgers_config.j.rule_timeout_s: must be > 0"),
        ({"rule_only": True, "read_timeout_s": True}, "judgers_config.j.read_timeout_s: expected int or float"),
        ({"rule_only": True, "max_retries": 0}, "judgers_config.j.max_retries: must be >= 1"),
        ({"rule_only": True, "concurrency_per_proc": (8,)}, "judgers_config.j.concurrency_per_proc"),
        ({"rule_only": True, "stop_word": ""}, "judgers_config.j.stop_word: must not be empty"),
        ({"rule_only": True, "verify_prompt": "{question} {answer}"}, "judgers_config.j.verify_prompt: must use"),
        ({"rule_only": True, "verify_prompt": "{question"}, "judgers_config.j.verify_prompt: not a str.format"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_bad_entry_names_the_key(raw, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        parse_judger_settings("j", raw)
