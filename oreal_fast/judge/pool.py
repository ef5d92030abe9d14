"""Worker processes that run rule checks under a per-sample time limit.

What it does: `RulePool.run(tasks)` sends (mode, text, gold, time limit) tasks to a few
worker processes, one task per worker at a time, and yields each verdict as it arrives. A
worker past its task's deadline is killed (SIGKILL) and replaced; its task's verdict is
`TIMED_OUT`. sympy can spin for hours on inputs like ``10^{10^{10}}`` and a Python thread
cannot be interrupted inside a C big-integer operation, so only a separate process gives
a hard limit.

Workers come from a fork server that has already imported sympy and math-verify, so
starting or replacing one costs a fork, not a second of imports; they start lazily at the
first task, so a run that never checks a rule starts none. Each worker caps its address
space, so a huge power turns into a quick MemoryError instead of swapping the machine.

What it does not: it knows nothing about rewards or servers (see router.py).

Invariant: every task given to `run` gets exactly one verdict, within about its time limit
after it reached a worker; no task is lost when a worker dies.
"""

import collections
import enum
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

_RULE_MODULES = ["oreal_fast.judge.rule_official", "oreal_fast.judge.rule_strict"]
# Address space a worker may add to what it has mapped at start: far above what a real check
# needs (tens of MB), far below a machine's memory.
_WORKER_HEADROOM = 4 << 30


class RuleVerdict(enum.Enum):
    CONFIRMED = "confirmed"
    NOT_CONFIRMED = "not_confirmed"
    TIMED_OUT = "timed_out"  # also a worker that died mid-task


class RuleTask(NamedTuple):
    mode: str  # "official" | "strict"
    text: str  # post-processed response (stop words removed, cut after thinking words)
    gold: str
    timeout_s: float


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """Loop of one worker: receive a task, send back a bool, until told to stop (None)."""
    import importlib
    import signal

    # A terminal's Ctrl-C reaches the whole process group; the trainer handles it and stops its
    # workers itself, so a worker must not die of it (mid-import, its pipe would just break).
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    checkers = {
        "official": importlib.import_module(_RULE_MODULES[0]).check,
        "strict": importlib.import_module(_RULE_MODULES[1]).check,
    }
    _cap_address_space()
    try:
        conn.send("ready")  # imports done: from now on a deadline measures checking alone
        while (task := conn.recv()) is not None:
            try:
                ok = bool(checkers[task[0]](task[1], task[2]))
            except BaseException:  # MemoryError etc.: the checker gave no verdict, so no +1
                ok = False
            conn.send(ok)
    except (EOFError, ConnectionError):  # the trainer is gone (a kill -9 resets the pipe): stop quietly
        return


def _cap_address_space() -> None:
    """Cap this process at its current mapping + headroom (a cap below it would fail every check)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        cap = mapped + _WORKER_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, OSError, ValueError):
        pass  # no /proc or rlimit on this platform: the deadline still holds


class _Worker:
    def __init__(self, ctx: multiprocessing.context.BaseContext) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="rule-check")
        self.proc.start()
        child.close()
        self.ready = False  # True once it has imported the checkers and said so

    def stop(self, kill: bool) -> None:
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                self.proc.kill()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


class RulePool:
    """A few rule-check processes, replaced when killed.

    Args:
        num_workers: processes to run (capped at the CPU count).
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = max(1, min(num_workers, os.cpu_count() or 1))
        methods = multiprocessing.get_all_start_methods()
        self._ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(_RULE_MODULES)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()  # one batch at a time owns the workers

    def run(self, tasks: list[RuleTask]) -> Iterator[tuple[int, RuleVerdict]]:
        """Yield ``(task index, verdict)`` for every task, in completion order."""
        with self._lock:
            while len(self._workers) < min(self.num_workers, len(tasks)):
                self._workers.append(_Worker(self._ctx))
            busy: dict[multiprocessing.connection.Connection, tuple[_Worker, int, float]] = {}
            try:
                yield from self._dispatch(tasks, busy)
            finally:
                # A caller that stopped early leaves answers in flight; a worker's next reply
                # must belong to its next task, so those workers go.
                for w, _, _ in busy.values():
                    self._replace(w)

    def _dispatch(self, tasks: list[RuleTask], busy: dict) -> Iterator[tuple[int, RuleVerdict]]:
        """Feed idle workers, collect answers, kill the late.

        `busy` maps a worker's connection to (worker, task index, deadline); the caller
        keeps it so that it can clean up after an early stop.
        """
        pending = collections.deque(enumerate(tasks))
        idle = [w for w in self._workers if w.ready]
        while pending or busy:
            while pending and idle:
                w = idle.pop()
                i, task = pending[0]
                try:
                    w.conn.send(tuple(task[:3]))
                except OSError:  # died while idle: replace it, keep the task
                    self._replace(w)
                    continue
                pending.popleft()
                busy[w.conn] = (w, i, time.monotonic() + task.timeout_s)
            starting = {w.conn: w for w in self._workers if not w.ready}
            wait_s = min((d for _, _, d in busy.values()), default=time.monotonic() + 1.0)
            wait_s = max(0.0, wait_s - time.monotonic())
            for conn in multiprocessing.connection.wait([*busy, *starting], timeout=wait_s):
                if conn in starting:
                    idle.append(self._greet(starting[conn]))
                    continue
                w, i, _ = busy.pop(conn)
                try:
                    ok = conn.recv()
                except (EOFError, OSError):
                    self._replace(w)
                    yield i, RuleVerdict.TIMED_OUT
                    continue
                idle.append(w)
                yield i, RuleVerdict.CONFIRMED if ok else RuleVerdict.NOT_CONFIRMED
            now = time.monotonic()
            for conn, (w, i, deadline) in list(busy.items()):
                if now >= deadline:
                    del busy[conn]
                    self._replace(w)
                    yield i, RuleVerdict.TIMED_OUT

    def _greet(self, w: _Worker) -> _Worker:
        """Read a starting worker's ready message."""
        try:
            w.conn.recv()
        except (EOFError, OSError):
            # Dying before the first task is an environment fault (an import failed, see
            # its traceback above); restarting would loop for ever.
            raise RuntimeError(
                "rule-check worker process exited while starting; check that sympy and"
                " math-verify import in this environment"
            ) from None
        w.ready = True
        return w

    def _replace(self, w: _Worker) -> _Worker:
        w.stop(kill=True)
        fresh = _Worker(self._ctx)
        self._workers[self._workers.index(w)] = fresh
        return fresh

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        with self._lock:
            for w in self._workers:
                w.stop(kill=False)
            self._workers.clear()
