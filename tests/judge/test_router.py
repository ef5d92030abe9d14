"""Router end to end: rule workers plus the verifier client against a real local server.

No test measures elapsed time: bounded waits are shown by what the server and the worker
pool saw (requests the client gave up on, workers replaced, requests in flight).
"""

import pytest
from cpu_load import BusyMachine

from oreal_fast.judge import JudgeItem, Router
from oreal_fast.judge import router as router_module

E = "<|im_end|>"
FAST = {  # timeouts small enough for tests; every failure path still takes the real code path
    "num_processes": 2,
    "rule_timeout_s": 5.0,
    "connect_timeout_s": 1.0,
    "read_timeout_s": 1.0,
    "max_retries": 2,
    "retry_delay_s": 0.05,
    "max_concurrency": 16,
}
MAPPING = {"math": ["math_judger"]}


def _miss(kind: str) -> JudgeItem:
    """A response the rule cannot confirm, so the server's scripted reply decides."""
    return JudgeItem(question=f"Q-{kind}", response_text=r"work... \boxed{7}" + E, gold_answer=f"REPLY={kind}")


def _router(hosts: list[str], **extra) -> Router:
    return Router({"math_judger": {"hosts": hosts, **FAST, **extra}}, MAPPING)


@pytest.mark.parametrize(
    "switch,expected,failures",
    [
        # A, B, CORRECT, INCORRECT, garbage, HTTP 500, never answers, rule +1, no stop word
        (False, [1, -1, -1, -1, -1, -1, -1, 1, -1], 5),
        (True, [1, -1, 1, -1, -1, -1, -1, 1, -1], 3),
    ],
    ids=["official-AB-parse", "accept-correct-incorrect"],
)
def test_every_server_behaviour_ends_in_its_reward_in_order(server, switch, expected, failures):
    items = [_miss(k) for k in ("A", "B", "CORRECT", "INCORRECT", "GARBAGE", "ERROR500", "HANG")]
    items += [JudgeItem("Q", r"\boxed{42}" + E, "42"), JudgeItem("Q", r"\boxed{42}", "42")]
    with _router([server.host], accept_correct_incorrect=switch) as r:
        out = r.judge(items)
    assert out.rewards == [float(x) for x in expected]
    assert out.counters == {
        "rule_confirmed": 1, "verifier_calls": 7, "verifier_failures": failures,
        "rule_timeouts": 0, "no_stop_word": 1, "invalid_items": 0,
    }
    # A call without a grade is tried max_retries (2) times; a graded one once. The hung
    # request returned because the client gave up on both attempts (its read timeout).
    attempts = {k: server.kinds().count(k) for k in set(server.kinds())}
    ungraded = 2 if not switch else 1
    assert attempts == {"A": 1, "B": 1, "CORRECT": ungraded, "INCORRECT": ungraded,
                        "GARBAGE": 2, "ERROR500": 2, "HANG": 2}
    assert server.abandoned == 2


def test_request_carries_official_settings_and_whole_text(server):
    with _router([server.host]) as r:
        r.judge([JudgeItem("What is 6*7?", r"<think>hmm</think>I get \boxed{7}." + E, "REPLY=A")])
    (body,) = server.bodies
    assert body["model"] == "judge-model"
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.0, 0.8, 20)
    assert (body["repetition_penalty"], body["max_tokens"]) == (1.05, 100)
    assert body["stop"] == ["<|im_end|>", "<|endoftext|>"]
    prompt = body["messages"][0]["content"]
    # the text after the last thinking word, stop word removed, not the extracted answer
    assert "What is 6*7?" in prompt and "REPLY=A" in prompt and r"I get \boxed{7}." in prompt
    assert "<think>" not in prompt and E not in prompt


def test_verify_prompt_from_config_is_used(server):
    with _router([server.host], verify_prompt="Q:{question} G:{gold_answer} R:{answer} {{x}}") as r:
        r.judge([_miss("A")])
    assert server.bodies[0]["messages"][0]["content"] == r"Q:Q-A G:REPLY=A R:work... \boxed{7} {x}"


def test_refused_connection_is_a_counted_failure(refused_host):
    with _router([refused_host]) as r:
        out = r.judge([_miss("A"), JudgeItem("Q", r"\boxed{3}" + E, "3"), _miss("B")])
    assert out.rewards == [-1.0, 1.0, -1.0]
    assert (out.counters["verifier_calls"], out.counters["verifier_failures"]) == (2, 2)


def test_unreachable_host_does_not_break_start_and_rule_only_never_calls(refused_host, server):
    with _router([refused_host, server.host], rule_only=True) as r:
        out = r.judge([_miss("A"), JudgeItem("Q", r"\boxed{3}" + E, "3")])
    assert out.rewards == [-1.0, 1.0]
    assert out.counters["verifier_calls"] == 0 and server.bodies == []


def test_hosts_are_used_round_robin(server, second_server):
    with _router([server.host, second_server.host], max_concurrency=1) as r:
        out = r.judge([_miss("A") for _ in range(4)])
    assert out.rewards == [1.0] * 4
    assert (len(server.bodies), len(second_server.bodies)) == (2, 2)


def test_power_tower_finishes_within_its_limit_in_both_modes():
    limit = 2.0
    config = {
        name: {"rule_only": True, "num_processes": 2, "rule_timeout_s": limit, "rule_mode": mode}
        for name, mode in (("official_judger", "official"), ("strict_judger", "strict"))
    }
    mapping = {"math": ["official_judger"], "math_strict": ["strict_judger"]}
    # sympy computes for hours on both (strict decides a pure power tower exactly, so its
    # input adds 1, and refuses a sum for a plain number at once, so its gold is a root)
    items = [
        JudgeItem("Q", r"\boxed{10^{10^{10}}}" + E, "5", "math"),
        JudgeItem("Q", r"\boxed{10^{10^{10}}+1}" + E, r"\sqrt{5}", "math_strict"),
        JudgeItem("Q", r"\boxed{5}" + E, "5", "math"),
        JudgeItem("Q", r"\boxed{5}" + E, "5", "math_strict"),
    ]
    with Router(config, mapping) as r:
        r.judge(items[2:])  # start both workers
        before = {w.proc.pid for w in r._pool._workers}
        old = list(r._pool._workers)
        out = r.judge(items)
        after = {w.proc.pid for w in r._pool._workers}
    assert out.rewards == [-1.0, -1.0, 1.0, 1.0]
    assert out.counters["rule_timeouts"] == 2
    # both workers held a tower past its limit: both were killed and replaced, not waited for
    assert before.isdisjoint(after) and len(after) == 2
    assert not any(w.proc.is_alive() for w in old)


def test_unknown_data_source_names_it():
    with Router({"math_judger": {"rule_only": True}}, MAPPING) as r:
        with pytest.raises(ValueError, match="'geometry'"):
            r.judge([JudgeItem("Q", r"\boxed{1}" + E, "1", "geometry")])


def test_mapping_to_unconfigured_judger_is_rejected():
    with pytest.raises(ValueError, match="data_judger_mapping.math"):
        Router({"math_judger": {"rule_only": True}}, {"math": ["other_judger"]})


def test_empty_judgers_config_is_rejected():
    with pytest.raises(ValueError, match="judgers_config: no judger"):
        Router({}, MAPPING)


def test_empty_batch():
    with Router({"math_judger": {"rule_only": True}}, MAPPING) as r:
        out = r.judge([])
    assert out.rewards == [] and set(out.counters.values()) == {0}


@pytest.mark.parametrize("gated_server,max_concurrency", [(8, 8), (4, 4)], indirect=["gated_server"])
def test_verifier_calls_run_concurrently(gated_server, max_concurrency):
    # Each GATE reply waits until max_concurrency requests are in flight together: all eight
    # get "A" only if the router keeps that many calls open at once, and never more.
    with _router([gated_server.host], max_concurrency=max_concurrency, max_retries=1,
                 read_timeout_s=gated_server.gate_wait_s + 30) as r:
        out = r.judge([_miss("GATE") for _ in range(8)])
    assert out.rewards == [1.0] * 8
    assert gated_server.max_in_flight == max_concurrency
    assert len(gated_server.bodies) == 8


def test_timed_out_rule_check_goes_to_the_verifier(server):
    with _router([server.host], rule_timeout_s=1.0, rule_mode="strict") as r:
        out = r.judge([JudgeItem("Q REPLY=A", r"\boxed{10^{10^{10}}+1}" + E, r"\sqrt{5}")])
    assert out.rewards == [1.0]
    assert (out.counters["rule_timeouts"], out.counters["verifier_calls"]) == (1, 1)


def test_an_item_that_cannot_be_judged_costs_one_counted_failure_not_the_batch(server):
    items = [
        _miss("A"),
        JudgeItem("Q", None, "5"),  # no response
        JudgeItem("Q", r"\boxed{None}" + E, None),  # no gold: str(None) must not match
        JudgeItem("Q REPLY=A", r"\boxed{7}" + E, "  "),  # blank gold
        JudgeItem(None, r"\boxed{3}" + E, "3"),
        None,
        JudgeItem("Q", r"\boxed{3}" + E, "3"),
    ]
    with _router([server.host]) as r:
        out = r.judge(items)
    assert out.rewards == [1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0]
    assert out.counters == {
        "rule_confirmed": 1, "verifier_calls": 1, "verifier_failures": 0,
        "rule_timeouts": 0, "no_stop_word": 0, "invalid_items": 5,
    }
    assert server.kinds() == ["A"]  # the bad items never reached the verifier



def test_a_check_over_its_cpu_limit_on_a_busy_machine_scores_and_counts_as_a_timeout(monkeypatch):
    # the official mode's workers run tests/judge/cpu_load.py's burn, which spends float(text) CPU seconds
    monkeypatch.setitem(router_module.RULE_CHECKS, "official", "cpu_load:burn")
    with Router({"math_judger": {"rule_only": True, "num_processes": 2, "rule_timeout_s": 1.0}}, MAPPING) as r:
        r.judge([JudgeItem("Q", "0" + E, "x"), JudgeItem("Q", "0" + E, "x")])  # both workers up
        with BusyMachine() as load:
            out = r.judge([JudgeItem("Q", "0.5" + E, "x"), JudgeItem("Q", "600" + E, "x"),
                           JudgeItem("Q", "0.5" + E, "x")])
            load_cpu_s = load.cpu_seconds()
    assert out.rewards == [1.0, -1.0, 1.0]
    assert (out.counters["rule_confirmed"], out.counters["rule_timeouts"]) == (2, 1)
    assert load_cpu_s > 0.5  # the load was real
