"""Worker processes that run rule checks under a per-sample CPU-time limit.

What it does: `RulePool.run(tasks)` sends (check, text, gold, CPU limit) tasks to a few worker
processes, one task per worker at a time, and yields each verdict as it arrives. A check is a
``"module:function"`` taking ``(text, gold)`` and returning a truth value (`OFFICIAL_CHECK`,
`STRICT_CHECK`, or any importable function: tests pass their own). A `RewardTask` runs a user's
reward function (``"module:function"`` or ``"/path/file.py:function"``) the same way and comes
back as its `RewardAnswer` (reward_fn.py reads what the function returned, in the worker). A
check that uses more than its limit of the worker's CPU time is killed with its worker, which
is replaced; its verdict is `TIMED_OUT`. sympy can spin for hours on inputs like ``10^{10^{10}}`` and a Python
thread cannot be interrupted inside a C big-integer operation, so only a separate process
gives a hard limit.

Why CPU time: a wall-clock limit made the verdict depend on how busy the machine was (the same
check passed alone and timed out beside other jobs). The limit counts the CPU seconds the
check itself spends, so a verdict is a function of the sample; a much larger wall-clock
backstop (`wall_backstop_s`) only catches a worker that is stuck off the CPU (blocked,
swapped out, deadlocked) and logs a warning when it fires.

Workers come from a fork server that has already imported sympy and math-verify, so starting
or replacing one costs a fork, not a second of imports; they start lazily at the first task,
so a run that never checks a rule starts none. Before a worker takes tasks it runs each
built-in check once (parsers load lazily on first use) and imports the ``preload`` checks (a
reward_fn), and a check named for the first time is imported before its limit starts, so no limit
ever pays for start-up. Each worker then caps its address space, so a huge power turns into a
quick MemoryError instead of swapping the machine.

What it does not: it counts no failure and knows no server; verdicts and reward answers go back as
they came (router.py turns them into rewards).

Invariant: every task given to `run` gets exactly one verdict, within its CPU limit of check
time (or the wall backstop) after it reached a worker; no task is lost when a worker dies.
"""

import collections
import enum
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

from oreal_fast.judge.reward_fn import RewardAnswer, RewardTask, call_reward_fn, load_function

OFFICIAL_CHECK = "oreal_fast.judge.rule_official:check"
STRICT_CHECK = "oreal_fast.judge.rule_strict:check"
_RULE_MODULES = [OFFICIAL_CHECK.split(":")[0], STRICT_CHECK.split(":")[0]]
# One check of each built-in kind, run by every worker before its first task: the first call
# loads sympy's LaTeX parser and math-verify's grammar (about 0.5 CPU-s), which must not count
# against a sample's limit.
_WARM_UP = [(OFFICIAL_CHECK, r"\boxed{\frac{1}{2}}", "0.5"), (STRICT_CHECK, r"\boxed{\frac{1}{2}}", "0.5")]
# Address space a worker may add to what it has mapped at start: far above what a real check
# needs (tens of MB), far below a machine's memory.
_WORKER_HEADROOM = 4 << 30
# A check at its CPU limit on a machine loaded 10 deep gets a tenth of a core and still ends
# within 10x its limit in wall time; the floor keeps short limits clear of scheduling hiccups.
_BACKSTOP_FACTOR = 10.0
_BACKSTOP_MIN_S = 60.0

log = logging.getLogger(__name__)
T = TypeVar("T")


class RuleVerdict(enum.Enum):
    CONFIRMED = "confirmed"
    NOT_CONFIRMED = "not_confirmed"
    TIMED_OUT = "timed_out"  # over the CPU limit or the wall backstop; also a worker that died mid-task


class RuleTask(NamedTuple):
    check: str  # "module:function", e.g. OFFICIAL_CHECK
    text: str  # post-processed response (stop words removed, cut after thinking words)
    gold: str
    timeout_s: float  # CPU seconds the check may use


def wall_backstop_s(cpu_limit_s: float) -> float:
    """Wall-clock seconds after which a worker that has not answered is killed whatever its CPU time."""
    return max(_BACKSTOP_FACTOR * cpu_limit_s, _BACKSTOP_MIN_S)


def _run_limited(call: Callable[[], T], cpu_limit_s: float) -> T:
    """``call()``, the process killed once the call has used ``cpu_limit_s`` of CPU time.

    ITIMER_PROF counts this process's CPU time (user + system) and raises SIGPROF, whose default
    action ends the process: the kernel enforces the limit even inside a C big-integer loop, at
    sub-second resolution, without the trainer having to be scheduled to watch (RLIMIT_CPU counts
    whole seconds since the process started; polling /proc from the trainer needs the trainer
    on a CPU, which is what a busy machine denies). Time spent waiting for a CPU is not counted.
    """
    signal.setitimer(signal.ITIMER_PROF, cpu_limit_s)
    try:
        return call()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def _verdict(check: Callable[[str, str], object], text: str, gold: str) -> bool:
    """``check(text, gold)`` as a bool."""
    try:
        return bool(check(text, gold))
    except BaseException:  # MemoryError etc.: the checker gave no verdict, so no +1
        return False


def _run_task(fn: Callable[..., object], task: tuple) -> bool | RewardAnswer:
    """One task under its CPU limit: a rule check's verdict, or a reward function's answer."""
    if isinstance(task, RewardTask):
        return _run_limited(lambda: call_reward_fn(fn, task), task.timeout_s)
    _, text, gold, cpu_limit_s = task
    return _run_limited(lambda: _verdict(fn, text, gold), cpu_limit_s)


def _worker_main(conn: multiprocessing.connection.Connection, preload: tuple[str, ...] = ()) -> None:
    """Loop of one worker: receive a task, send back a bool (a RewardAnswer for a RewardTask),
    until told to stop (None). ``preload``: checks to import at start, with the built-in ones.

    A check that cannot be imported is answered with its error message (a str), which the pool
    raises: a misnamed check must stop the run, not score every sample -1.
    """
    # A terminal's Ctrl-C reaches the whole process group; the trainer handles it and stops its
    # workers itself, so a worker must not die of it (mid-import, its pipe would just break).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # ends the process: the CPU limit (see _run_limited)
    # The limit counts the CPU time of all of this process's threads: a BLAS or OpenMP pool with one
    # thread per core (numpy loads at the warm-up below) would make a check's cost depend on the core count.
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    checks: dict[str, Callable[..., object]] = {}
    for spec, text, gold in _WARM_UP:
        checks[spec] = load_function(spec)
        checks[spec](text, gold)
    for spec in preload:  # before the memory cap: a reward_fn's module may map large libraries (torch)
        try:
            checks[spec] = load_function(spec)
        except Exception:  # loaded again at its first task, which reports the error
            pass
    _cap_address_space()
    try:
        conn.send("ready")  # imports and warm-up done: from now on a limit measures checking alone
        while (task := conn.recv()) is not None:
            spec = task[0]
            if spec not in checks:
                try:  # imported here, outside any limit
                    checks[spec] = load_function(spec)
                except Exception as e:
                    what = "reward_fn" if isinstance(task, RewardTask) else "rule check"
                    conn.send(f"{what} {spec!r} could not be loaded in the worker: {type(e).__name__}: {e}")
                    continue
            conn.send(_run_task(checks[spec], task))
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
        pass  # no /proc or rlimit on this platform: the CPU limit still holds


class _Worker:
    def __init__(self, ctx: multiprocessing.context.BaseContext, preload: tuple[str, ...]) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, preload), daemon=True, name="rule-check")
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
        preload: checks (``"module:function"`` or ``"/path/file.py:function"``) every worker imports
            as it starts, before its memory cap and outside any limit, as it does the built-in ones.
    """

    def __init__(self, num_workers: int, preload: tuple[str, ...] = ()) -> None:
        self.num_workers = max(1, min(num_workers, os.cpu_count() or 1))
        methods = multiprocessing.get_all_start_methods()
        self._ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self._preload = tuple(preload)
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(_RULE_MODULES)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()  # one batch at a time owns the workers

    def run(self, tasks: list[RuleTask | RewardTask]) -> Iterator[tuple[int, RuleVerdict | RewardAnswer]]:
        """Yield ``(task index, verdict)`` for every task, in completion order: a RuleVerdict for a
        RuleTask; for a RewardTask its RewardAnswer, or `RuleVerdict.TIMED_OUT` when it was killed."""
        with self._lock:
            while len(self._workers) < min(self.num_workers, len(tasks)):
                self._workers.append(_Worker(self._ctx, self._preload))
            busy: dict[multiprocessing.connection.Connection, tuple[_Worker, int, float]] = {}
            try:
                yield from self._dispatch(tasks, busy)
            finally:
                # A caller that stopped early leaves answers in flight; a worker's next reply
                # must belong to its next task, so those workers go.
                for w, _, _ in busy.values():
                    self._replace(w)

    def _dispatch(self, tasks: list[RuleTask | RewardTask],
                  busy: dict) -> Iterator[tuple[int, RuleVerdict | RewardAnswer]]:
        """Feed idle workers, collect answers, kill the stuck.

        `busy` maps a worker's connection to (worker, task index, wall backstop); the caller
        keeps it so that it can clean up after an early stop. A worker over its CPU limit ends
        itself (see `_run_limited`) and shows up here as a closed pipe.
        """
        pending = collections.deque(enumerate(tasks))
        idle = [w for w in self._workers if w.ready]
        while pending or busy:
            while pending and idle:
                w = idle.pop()
                i, task = pending[0]
                try:
                    w.conn.send(task)
                except OSError:  # died while idle: replace it, keep the task
                    self._replace(w)
                    continue
                pending.popleft()
                busy[w.conn] = (w, i, time.monotonic() + wall_backstop_s(task.timeout_s))
            starting = {w.conn: w for w in self._workers if not w.ready}
            wait_s = min((d for _, _, d in busy.values()), default=time.monotonic() + 1.0)
            wait_s = max(0.0, wait_s - time.monotonic())
            for conn in multiprocessing.connection.wait([*busy, *starting], timeout=wait_s):
                if conn in starting:
                    idle.append(self._greet(starting[conn]))
                    continue
                w, i, _ = busy.pop(conn)
                yield i, self._answer(w, idle)
            yield from self._stuck(busy, tasks)

    def _answer(self, w: _Worker, idle: list[_Worker]) -> RuleVerdict | RewardAnswer:
        """What a busy worker sent back (the worker goes back to `idle`), or TIMED_OUT for a worker
        that died, which is replaced."""
        try:
            ok = w.conn.recv()
        except (EOFError, OSError):  # over its CPU limit (SIGPROF), or died otherwise
            self._replace(w)
            return RuleVerdict.TIMED_OUT
        idle.append(w)
        if isinstance(ok, str):  # the check could not be imported
            raise RuntimeError(ok)
        if isinstance(ok, RewardAnswer):
            return ok
        return RuleVerdict.CONFIRMED if ok else RuleVerdict.NOT_CONFIRMED

    def _stuck(self, busy: dict, tasks: list[RuleTask | RewardTask]) -> Iterator[tuple[int, RuleVerdict]]:
        """Replace each busy worker past its wall backstop; its task is a timeout."""
        now = time.monotonic()
        for conn, (w, i, backstop) in list(busy.items()):
            if now >= backstop:
                del busy[conn]
                log.warning("check of task %d ran %.0f s of wall time without answering (stuck off the"
                            " CPU: blocked or swapped?); its worker is replaced and the sample counted as"
                            " a timeout", i, wall_backstop_s(tasks[i].timeout_s))
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
        fresh = _Worker(self._ctx, self._preload)
        self._workers[self._workers.index(w)] = fresh
        return fresh

    def live_workers(self) -> int:
        """How many worker processes are alive now (0 before the first task; read-only)."""
        return sum(w.proc.is_alive() for w in self._workers)

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        with self._lock:
            for w in self._workers:
                w.stop(kill=False)
            self._workers.clear()
