"""An example reward function for ``reward_fn`` (docs/rewards.md): exact match, shorter is better.

Use it as ``reward_fn = "oreal_fast.judge.example_rewards:length_penalised_exact_match"``, or copy
this file, change it and name the copy: ``reward_fn = "my_rewards.py:length_penalised_exact_match"``.

What it does not: read math. ``\\boxed{0.5}`` does not match the gold ``\\frac{1}{2}``; the math
judger (no reward_fn) is the one that compares values.

Invariant: a correct response scores in [1 - MAX_LENGTH_PENALTY, 1], always > 0, and a wrong one
-1, so the filter, the token RM and the loss see the correctness the match decided.
"""

STOP_WORD = "<|im_end|>"  # the config's stop_word: a response without it was cut off by gen_max_new
TARGET_CHARS = 2000  # a correct response up to this long gets the full reward
MAX_LENGTH_PENALTY = 0.5  # taken off a correct response twice TARGET_CHARS long or longer


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` in ``text`` (braces matched), None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed{") - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len("\\boxed{"): i]
    return None  # unbalanced: the answer was never closed


def _normalise(answer: str) -> str:
    """Whitespace and ``$`` removed: ``$ 42 $`` and ``42`` match, ``42.0`` and ``42`` do not."""
    return "".join(answer.replace("$", "").split())


def length_penalised_exact_match(record: dict, response: str, gold_answer: str) -> float:
    """+1 less a length penalty when the last ``\\boxed{}`` of a finished response equals the gold answer.

    Args:
        record: the prompt record (question, gold_answer, data_source, pass_rate); unused here.
        response: the decoded response, ending with STOP_WORD unless it was cut off.
        gold_answer: the record's gold answer.

    Returns:
        ``1 - MAX_LENGTH_PENALTY * min(1, max(0, len(response) / TARGET_CHARS - 1))`` for a match
        (a response of 3000 characters: 0.75), -1.0 for anything else.
    """
    if not response.rstrip().endswith(STOP_WORD):
        return -1.0
    answer = last_boxed(response)
    if answer is None or _normalise(answer) != _normalise(gold_answer):
        return -1.0
    excess = min(1.0, max(0.0, len(response) / TARGET_CHARS - 1.0))
    return 1.0 - MAX_LENGTH_PENALTY * excess
