"""Rule-check worker pool: one verdict per task, dead or stuck workers replaced."""

import os
import signal

import pytest

from oreal_fast.judge.pool import RulePool, RuleTask, RuleVerdict

YES = RuleTask("official", r"\boxed{\frac{1}{2}}", "0.5", 10.0)
NO = RuleTask("strict", r"\boxed{4200}", "42", 10.0)


@pytest.fixture(scope="module")
def pool():
    p = RulePool(2)
    yield p
    p.close()


def test_every_task_gets_its_verdict(pool):
    got = dict(pool.run([YES, NO, YES, NO, YES]))
    assert got == {0: RuleVerdict.CONFIRMED, 1: RuleVerdict.NOT_CONFIRMED, 2: RuleVerdict.CONFIRMED,
                   3: RuleVerdict.NOT_CONFIRMED, 4: RuleVerdict.CONFIRMED}


def test_worker_killed_while_idle_is_replaced(pool):
    list(pool.run([YES, YES]))
    for w in pool._workers:
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.join()
    assert dict(pool.run([NO, YES])) == {0: RuleVerdict.NOT_CONFIRMED, 1: RuleVerdict.CONFIRMED}


def test_caller_stopping_early_does_not_shift_later_answers(pool):
    list(pool.run([YES, YES]))  # both workers up
    old = {w.proc.pid: w.proc for w in pool._workers}
    slow = RuleTask("strict", r"\boxed{10^{10^{10}}+1}", "5", 600.0)  # sympy takes hours
    first = next(iter(pool.run([YES, slow])))  # the generator is dropped with `slow` in flight
    assert first == (0, RuleVerdict.CONFIRMED)
    # the worker holding `slow` was killed and replaced at once, not waited for (its limit is
    # far away); the idle one stays
    now = {w.proc.pid for w in pool._workers}
    (gone,) = set(old) - now
    assert len(now) == 2 and not old[gone].is_alive()
    assert dict(pool.run([NO, YES])) == {0: RuleVerdict.NOT_CONFIRMED, 1: RuleVerdict.CONFIRMED}


def test_empty_batch():
    assert list(RulePool(2).run([])) == []


def test_ctrl_c_to_the_process_group_does_not_kill_workers(pool):
    """A terminal's SIGINT reaches every process of the group: the workers ignore it (the trainer
    handles it and stops them), so they keep answering, with the same pids."""
    list(pool.run([YES, YES]))
    pids = [w.proc.pid for w in pool._workers]
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    assert dict(pool.run([NO, YES])) == {0: RuleVerdict.NOT_CONFIRMED, 1: RuleVerdict.CONFIRMED}
    assert [w.proc.pid for w in pool._workers] == pids and all(w.proc.is_alive() for w in pool._workers)


class _ResetPipe:
    """The worker's end of the pipe after the trainer died with a task or reply in flight."""

    def __init__(self, fail_on):
        self.fail_on, self.sent = fail_on, []

    def recv(self):
        if self.fail_on == "recv":
            raise ConnectionResetError(104, "Connection reset by peer")
        self.fail_on = "send"
        return ("official", YES.text, YES.gold)

    def send(self, value):
        self.sent.append(value)
        if self.fail_on == "send" and value != "ready":
            raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("fail_on", ["recv", "send"])
def test_worker_whose_trainer_was_killed_exits_without_a_traceback(monkeypatch, fail_on):
    from oreal_fast.judge import pool as pool_module

    # run the worker loop in this process, without its process-wide settings
    monkeypatch.setattr(pool_module, "_cap_address_space", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    pipe = _ResetPipe(fail_on)
    pool_module._worker_main(pipe)  # returns instead of raising
    assert pipe.sent == (["ready"] if fail_on == "recv" else ["ready", True])
