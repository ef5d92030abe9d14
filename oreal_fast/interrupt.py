"""SIGINT and SIGTERM stop a run at its next safe point, never in the middle of a write.

The trainer names each phase as it enters it (``start``, ``generate``, ``judge``, ``rl``, ``done``,
``checkpoint``); every phase boundary is a safe point. A first signal during ``start`` or
``generate`` stops at once (nothing there is worth finishing: a resumed run redoes the step's
generation exactly); during any other phase it is remembered and the run stops when that phase
ends. Either way :class:`StopRun` is raised in the main thread; the trainer then writes a resume
state if a step finished since the last one and the command line prints one line and exits with
128 + the signal number (130 for SIGINT, 143 for SIGTERM). A second signal exits at once.

What this module does not do: save anything, or know what a step is. Invariant: :class:`StopRun`
is only ever raised at a phase boundary or inside an interruptible phase.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPTIBLE = frozenset({"start", "generate"})


class StopRun(BaseException):
    """A stop signal reached a safe point. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way up mistakes it for an error of the code it passes through.

    Attributes:
        signum: the signal.
        phase, step: the phase and 1-based step it arrived in (step None before the first step).
        outcome: what the trainer did about it (set on the way up), e.g. which state is on disk.
    """

    def __init__(self, signum: int, phase: str, step: int | None) -> None:
        super().__init__(signal.Signals(signum).name, phase, step)
        self.signum = signum
        self.phase = phase
        self.step = step
        self.outcome = "nothing was written (the run had not started its first step)"
        self.resume_dir: str | None = None  # the folder --resume continues, None when no state is on disk

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class StopSignals:
    """The run's stop flag. Inert until :meth:`installed`; the trainer calls :meth:`enter` at
    each phase boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.phase = "start"
        self.step: int | None = None  # the 1-based step running, set by the trainer
        self._arrived: tuple[str, int | None] = ("start", None)  # phase and step of the first signal

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Handles SIGINT and SIGTERM while the block runs (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def enter(self, phase: str) -> None:
        """A phase boundary: stop here if a signal came, else start ``phase``."""
        if self.signum is not None:
            raise StopRun(self.signum, *self._arrived)
        self.phase = phase

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            name = signal.Signals(signum).name
            sys.stderr.write(f"\n{name} again during {self.phase}: exiting at once; --resume takes the newest "
                             "complete resume state on disk\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signum = signum
        self._arrived = (self.phase, self.step)
        if self.phase in INTERRUPTIBLE:
            raise StopRun(signum, *self._arrived)
