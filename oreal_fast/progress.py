"""Progress within a phase of a run: counts that the work adds to as it goes, and the line that shows them.

The trainer starts each phase (`Progress.start`: generate, judge, rl, validate, checkpoint) and says
how much work it holds once that is known (`Progress.expect`); the parts doing the work add what
they finished (`Progress.add`) where they already hold host values: the plain sampler after each
decode step, the paged engine at the end of each prefill chunk and decode round (its one host sync
per round), the RL phase after queueing each micro-batch. `Progress.line` formats the counts with
their rate and the phase's elapsed time; `ProgressTicker` redraws a progress bar with it every few
seconds (every half minute into a log file) from a thread of its own, so the line moves even while
one long forward runs. Subscribers
(`Progress.subscribe`) see every change as a `PhaseCounts`.

Not here: what a phase is and when it starts (the trainer), anything on a device.
Invariant: `add` takes host ints its caller already holds and reads no tensor, so reporting
progress never adds a host sync.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

REFRESH_S = 2.0  # how often the ticker redraws the bar on a terminal
LOG_REFRESH_S = 30.0  # and into a file or pipe, where each redraw stays as a line of the log


@dataclass(frozen=True)
class PhaseCounts:
    """What one phase has done so far.

    Attributes:
        phase: its name ("" before the first phase).
        unit: what ``done`` and ``total`` count ("responses", "micro-batches"); "" until known.
        total: the work the phase holds, None until known.
        done: units finished.
        tokens: tokens generated (or trained) in it.
        seconds: time since the phase started.
    """

    phase: str
    unit: str
    total: int | None
    done: int
    tokens: int
    seconds: float


class Progress:
    """The current phase's counts; written by the thread that runs the work, read by any thread.

    Args:
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._listeners: list[Callable[[PhaseCounts], None]] = []
        self._phase, self._unit, self._total = "", "", None
        self._done = self._tokens = 0
        self._start = clock()

    def subscribe(self, listener: Callable[[PhaseCounts], None]) -> None:
        """Calls ``listener`` with the counts after every `start`, `expect` and `add`."""
        self._listeners.append(listener)

    def start(self, phase: str) -> None:
        """A new phase: counts back to zero, its clock restarted, its total unknown."""
        with self._lock:
            self._phase, self._unit, self._total = phase, "", None
            self._done = self._tokens = 0
            self._start = self._clock()
        self._notify()

    def expect(self, total: int, unit: str) -> None:
        """The phase holds ``total`` units of work, counted in ``unit``."""
        with self._lock:
            self._total, self._unit = total, unit
        self._notify()

    def add(self, done: int = 0, tokens: int = 0) -> None:
        """``done`` more units finished and ``tokens`` more tokens made (host ints)."""
        with self._lock:
            self._done += done
            self._tokens += tokens
        self._notify()

    def counts(self) -> PhaseCounts:
        """The counts now."""
        with self._lock:
            return PhaseCounts(self._phase, self._unit, self._total, self._done, self._tokens,
                               self._clock() - self._start)

    def line(self) -> str:
        """The phase on one line: ``generate 12/16 responses, 1.2k tokens, 310 tok/s, 0:42``."""
        c = self.counts()
        parts = [c.phase]
        if c.unit:
            parts.append(f"{c.done}/{c.total} {c.unit}" if c.total is not None else f"{c.done} {c.unit}")
        text = " ".join(parts)
        if c.tokens:
            text += f", {_short(c.tokens)} tokens, {_short(c.tokens / max(c.seconds, 1e-9))} tok/s"
        return f"{text}, {_clock_text(c.seconds)}"

    def _notify(self) -> None:
        if self._listeners:
            counts = self.counts()
            for listener in self._listeners:
                listener(counts)


def refresh_interval(stream: TextIO) -> float:
    """`REFRESH_S` when ``stream`` is a terminal, else `LOG_REFRESH_S`."""
    return REFRESH_S if stream.isatty() else LOG_REFRESH_S


class ProgressTicker:
    """Calls ``redraw`` every ``interval`` seconds from a daemon thread until `close`.

    Args:
        redraw: draws the current line (e.g. sets a tqdm bar's postfix and refreshes it).
        interval: seconds between redraws.
    """

    def __init__(self, redraw: Callable[[], None], interval: float = REFRESH_S) -> None:
        self._redraw, self._interval = redraw, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="oreal-progress", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._redraw()

    def close(self) -> None:
        """Stops the thread and waits for it (at most one redraw)."""
        self._stop.set()
        self._thread.join()


def _short(x: float) -> str:
    """1234 -> ``1.2k``, 2_500_000 -> ``2.5M``; below 1000 the integer."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.1f}{suffix}"
    return f"{x:.0f}"


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
