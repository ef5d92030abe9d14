"""Rule-check worker pool: one verdict per task, dead or stuck workers replaced, a CPU-time limit
that machine load does not move."""

import os
import signal

import pytest
from cpu_load import BusyMachine

from oreal_fast.judge.pool import OFFICIAL_CHECK, STRICT_CHECK, RulePool, RuleTask, RuleVerdict

YES = RuleTask(OFFICIAL_CHECK, r"\boxed{\frac{1}{2}}", "0.5", 10.0)
NO = RuleTask(STRICT_CHECK, r"\boxed{4200}", "42", 10.0)
BURN = "cpu_load:burn"  # tests/judge/cpu_load.py: burns float(text) CPU seconds, then True


@pytest.fixture(scope="module")
def pool():
    p = RulePool(2)
    yield p
    p.close()


def _all_ready(pool):
    """Run checks until every worker has started and answered: a batch that ends before a starting
    (or replacing) worker is ready leaves it starting, and the next batch would not use it at once."""
    while len(pool._workers) < pool.num_workers or not all(w.ready for w in pool._workers):
        list(pool.run([YES] * pool.num_workers))


def test_every_task_gets_its_verdict(pool):
    got = dict(pool.run([YES, NO, YES, NO, YES]))
    assert got == {0: RuleVerdict.CONFIRMED, 1: RuleVerdict.NOT_CONFIRMED, 2: RuleVerdict.CONFIRMED,
                   3: RuleVerdict.NOT_CONFIRMED, 4: RuleVerdict.CONFIRMED}


def test_worker_killed_while_idle_is_replaced(pool):
    _all_ready(pool)
    for w in pool._workers:
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.join()
    assert dict(pool.run([NO, YES])) == {0: RuleVerdict.NOT_CONFIRMED, 1: RuleVerdict.CONFIRMED}


def test_caller_stopping_early_does_not_shift_later_answers(pool):
    _all_ready(pool)  # so that both tasks below are sent at once
    old = {w.proc.pid: w.proc for w in pool._workers}
    slow = RuleTask(STRICT_CHECK, r"\boxed{10^{10^{10}}+1}", r"\sqrt{5}", 600.0)  # sympy takes hours
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
    _all_ready(pool)
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
        return tuple(YES)

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
    monkeypatch.setattr(signal, "setitimer", lambda *args: None)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")  # the worker loop sets these; monkeypatch restores them after
    pipe = _ResetPipe(fail_on)
    pool_module._worker_main(pipe)  # returns instead of raising
    assert pipe.sent == (["ready"] if fail_on == "recv" else ["ready", True])



def test_cpu_limit_is_not_moved_by_machine_load():
    """Checks that each burn 0.5 CPU-s pass under a 1 CPU-s limit while three busy loops compete for
    the cores (on two cores each such check then spans well over 1 s of wall time); one that needs
    more than its limit is cut by that limit and its worker replaced."""
    pool = RulePool(2)
    try:
        _all_ready(pool)
        started = {w.proc.pid: w.proc for w in pool._workers}
        fits, over = RuleTask(BURN, "0.5", "", 1.0), RuleTask(BURN, "600", "", 0.5)
        with BusyMachine() as load:
            got = dict(pool.run([fits, fits, over, fits]))
            load_cpu_s = load.cpu_seconds()
        now = {w.proc.pid for w in pool._workers}
        assert dict(pool.run([NO, YES])) == {0: RuleVerdict.NOT_CONFIRMED, 1: RuleVerdict.CONFIRMED}
    finally:
        pool.close()
    assert got == {0: RuleVerdict.CONFIRMED, 1: RuleVerdict.CONFIRMED, 2: RuleVerdict.TIMED_OUT,
                   3: RuleVerdict.CONFIRMED}
    (gone,) = [p for pid, p in started.items() if pid not in now]
    assert gone.exitcode == -signal.SIGPROF  # ended by its CPU limit, not by the wall backstop
    assert len(now) == 2
    assert load_cpu_s > 0.5  # the load was real

def test_a_check_that_cannot_be_imported_is_an_error_not_a_score():
    pool = RulePool(1)
    try:
        with pytest.raises(RuntimeError, match="'cpu_load:no_such_check' could not be loaded.*AttributeError"):
            list(pool.run([RuleTask("cpu_load:no_such_check", "1", "", 10.0)]))
        assert dict(pool.run([YES])) == {0: RuleVerdict.CONFIRMED}  # the worker still serves
    finally:
        pool.close()


def test_live_workers_counts_processes_alive(pool):
    _all_ready(pool)
    assert pool.live_workers() == 2
    os.kill(pool._workers[0].proc.pid, signal.SIGKILL)
    pool._workers[0].proc.join()
    assert pool.live_workers() == 1
    list(pool.run([YES, NO]))  # the dead one is replaced at the next send
    assert pool.live_workers() == 2
