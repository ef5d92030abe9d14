"""Typed settings of one math judger, parsed from an entry of ``judgers_config``.

What it does: `parse_judger_settings(name, raw)` checks every key of one judger entry and
returns a frozen `MathJudgerSettings`. The official keys keep their meaning; ours add the
rule mode, a rule-only switch, timeouts, retries and the verifier prompt.

What it does not: it opens no connection and starts no process (see router.py).

Invariant: a bad entry raises ``ValueError("judgers_config.<name>.<key>: <why>")``; a
returned settings object is always usable as is.
"""

import dataclasses
import string
import urllib.parse

RULE_MODES = ("official", "strict")

# Our own wording; same three fields and the same A/B answer protocol as the official prompt.
DEFAULT_VERIFY_PROMPT = """You grade answers to math problems. Decide whether the candidate's final answer agrees with the reference answer.

Rules:
1. Treat the reference answer as correct. Do not solve the problem yourself.
2. Equivalent forms count as agreeing (for example 1/2, 0.5 and \\frac{{1}}{{2}}; reordered terms; an equation and its solved form), as long as they mean the same for this question.
3. If the question asks for several values or options, every one of them must agree.
4. Ignore \\boxed{{}} and other wrapping around the candidate's answer; judge only its content.

Reply with a single letter and nothing else:
A: the candidate's answer agrees with the reference (CORRECT)
B: it does not agree (INCORRECT)

[Question]
{question}

[Reference answer]
{gold_answer}

[Candidate response]
{answer}

Your grade (A or B):"""

PROMPT_FIELDS = frozenset({"question", "gold_answer", "answer"})


@dataclasses.dataclass(frozen=True)
class MathJudgerSettings:
    """One math judger.

    Official keys: hosts, stop_word, thinking_finish_words, num_processes,
    concurrency_per_proc. Ours: everything from rule_mode on.
    """

    name: str
    hosts: tuple[str, ...] = ()  # "host:port" or "http://host:port" of OpenAI-compatible servers
    stop_word: str = "<|im_end|>"  # a response must end with it (after strip) to be judged
    thinking_finish_words: tuple[str, ...] = ("<conclude>", "**Final Answer**", "</think>")
    num_processes: int = 8  # rule-check worker processes (capped at the CPU count)
    # Official per-process thread counts; here only the default of max_concurrency.
    concurrency_per_proc: tuple[int, int] = (8, 8)
    rule_mode: str = "official"  # "official": reference 10.4 verdicts; "strict": correct checker
    rule_only: bool = False  # never call a server: a rule miss is -1
    # per-sample rule-check limit in CPU seconds the check itself uses (not wall time, so machine
    # load does not change verdicts); over it = failed check. A worker that does not answer within
    # max(10 x this, 60 s) of wall time is treated the same way (pool.wall_backstop_s).
    rule_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    max_retries: int = 3  # attempts per verifier call (the official made 1)
    retry_delay_s: float = 1.0  # back-off before attempt n+1 is retry_delay_s * 2**(n-1)
    verify_prompt: str = DEFAULT_VERIFY_PROMPT  # str.format template with question, gold_answer, answer
    accept_correct_incorrect: bool = False  # also read replies "CORRECT"/"INCORRECT"
    max_concurrency: int = 64  # verifier requests in flight per judger


def split_host(host: str) -> tuple[str, int]:
    """'h:p' or 'http://h:p' -> (h, p); ValueError for anything else."""
    url = urllib.parse.urlsplit(host if "://" in host else f"http://{host}")
    if url.scheme != "http" or not url.hostname or url.path not in ("", "/"):
        raise ValueError(f"expected host:port or http://host:port, got {host!r}")
    return url.hostname, url.port or 80


def _fail(name: str, key: str, why: str) -> ValueError:
    return ValueError(f"judgers_config.{name}.{key}: {why}")


def _prompt_fields(name: str, template: str) -> str:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        raise _fail(name, "verify_prompt", f"not a str.format template ({e})") from None
    if fields != PROMPT_FIELDS:
        raise _fail(
            name, "verify_prompt",
            f"must use exactly the fields {sorted(PROMPT_FIELDS)}, got {sorted(fields)}"
            " (write literal braces as {{ }})",
        )
    return template


def _check_type(name: str, key: str, value: object, kinds: tuple[type, ...]) -> None:
    # bool is an int subclass: a True timeout is a typo, not 1 second.
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        want = " or ".join(k.__name__ for k in kinds)
        raise _fail(name, key, f"expected {want}, got {type(value).__name__} {value!r}")


def _str_tuple(name: str, key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise _fail(name, key, f"expected a list of strings, got {value!r}")
    for v in value:
        _check_type(name, key, v, (str,))
    return tuple(value)


def parse_judger_settings(name: str, raw: dict) -> MathJudgerSettings:
    """Validate one ``judgers_config`` entry.

    Args:
        name: the entry's key in ``judgers_config`` (e.g. "math_judger").
        raw: its dict of settings; absent keys take the defaults above.

    Returns:
        The settings.

    Raises:
        ValueError: ``judgers_config.<name>.<key>: <why>`` for an unknown key, a wrong type or
            an out-of-range value; also when no host is given and rule_only is false.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"judgers_config.{name}: expected a dict of settings, got {raw!r}")
    v = _known_keys(name, raw)
    _check_hosts_and_words(name, v)
    _check_scalars(name, v)
    _check_concurrency(name, v)
    if v.get("rule_mode", "official") not in RULE_MODES:
        raise _fail(name, "rule_mode", f"expected one of {RULE_MODES}, got {v['rule_mode']!r}")
    if not v.get("stop_word", "x"):
        raise _fail(name, "stop_word", "must not be empty")
    if "verify_prompt" in v:
        v["verify_prompt"] = _prompt_fields(name, v["verify_prompt"])
    if not v.get("hosts") and not v.get("rule_only", False):
        raise _fail(name, "hosts", "no verifier host given; list one or set rule_only: True")
    return MathJudgerSettings(name=name, **v)


def _known_keys(name: str, raw: dict) -> dict:
    """A copy of ``raw`` whose every key is a setting; a None verify_prompt dropped (our default)."""
    fields = {f.name for f in dataclasses.fields(MathJudgerSettings) if f.name != "name"}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise _fail(name, unknown[0], f"unknown key (known: {', '.join(sorted(fields))})")
    v = dict(raw)
    if "verify_prompt" in v and v["verify_prompt"] is None:
        del v["verify_prompt"]  # None = our default prompt
    return v


def _check_hosts_and_words(name: str, v: dict) -> None:
    for key in ("hosts", "thinking_finish_words"):
        if key in v:
            v[key] = _str_tuple(name, key, v[key])
    for host in v.get("hosts", ()):
        try:
            split_host(host)
        except ValueError as e:
            raise _fail(name, "hosts", str(e)) from None


def _check_scalars(name: str, v: dict) -> None:
    """Strings, flags, counts >= 1 and durations > 0 (a retry delay may be 0), in place."""
    for key in ("stop_word", "rule_mode", "verify_prompt"):
        if key in v:
            _check_type(name, key, v[key], (str,))
    for key in ("rule_only", "accept_correct_incorrect"):
        if key in v:
            _check_type(name, key, v[key], (bool,))
    for key in ("num_processes", "max_retries", "max_concurrency"):
        if key in v:
            _check_type(name, key, v[key], (int,))
            if v[key] < 1:
                raise _fail(name, key, f"must be >= 1, got {v[key]}")
    for key in ("rule_timeout_s", "connect_timeout_s", "read_timeout_s", "retry_delay_s"):
        if key in v:
            _check_type(name, key, v[key], (int, float))
            if v[key] < 0 or (v[key] == 0 and key != "retry_delay_s"):
                raise _fail(name, key, f"must be > 0, got {v[key]}")
            v[key] = float(v[key])


def _check_concurrency(name: str, v: dict) -> None:
    if "concurrency_per_proc" not in v:
        return
    c = v["concurrency_per_proc"]
    if not isinstance(c, (list, tuple)) or len(c) != 2 or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in c
    ):
        raise _fail(name, "concurrency_per_proc", f"expected two positive ints, got {c!r}")
    v["concurrency_per_proc"] = tuple(c)
    v.setdefault("max_concurrency", v.get("num_processes", 8) * c[0])
