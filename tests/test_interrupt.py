"""The stop flag: a first signal stops at once while generating and at the next phase boundary
otherwise, naming the phase and step it arrived in; handlers are restored afterwards; the command
that continues a run replaces any --resume."""

from __future__ import annotations

import os
import signal

import pytest

from oreal_fast.interrupt import StopRun, StopSignals
from oreal_fast.train import _continue_command


def test_a_signal_while_generating_stops_at_once():
    stop = StopSignals()
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(StopRun) as e, stop.installed():
        stop.step = 2
        stop.enter("generate")
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10**6):  # the handler runs between bytecodes of this loop
            pass
        raise AssertionError("not stopped while generating")
    assert (e.value.name, e.value.phase, e.value.step, e.value.exit_code) == ("SIGINT", "generate", 2, 130)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_in_the_rl_phase_waits_for_the_next_boundary():
    stop = StopSignals()
    with stop.installed():
        stop.step = 3
        stop.enter("rl")
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**6):
            pass
        assert stop.signum == signal.SIGTERM  # seen, not acted on: the phase goes on
        with pytest.raises(StopRun) as e:
            stop.step = 4
            stop.enter("done")
    assert (e.value.name, e.value.phase, e.value.step, e.value.exit_code) == ("SIGTERM", "rl", 3, 143)


@pytest.mark.parametrize("argv, resume_dir, expected", [
    (["c.py", "--resume", "auto", "--total_steps", "3"], "/w/r", "c.py --total_steps 3 --resume /w/r"),
    (["c.py", "--resume=auto"], "/w/r", "c.py --resume /w/r"),
    (["c.py", "--resume", "auto"], None, "c.py --resume auto"),  # nothing on disk: the command as given
])
def test_continue_command(argv, resume_dir, expected):
    assert _continue_command(argv, resume_dir).split(" ", 3)[3] == expected
