"""The progress line of a phase, its counts on a fake clock, and the ticker that redraws it."""

import io
import threading

from oreal_fast.progress import LOG_REFRESH_S, REFRESH_S, PhaseCounts, Progress, ProgressTicker, refresh_interval


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_counts_and_line_follow_the_phase():
    clock = FakeClock()
    progress = Progress(clock)
    progress.start("generate")
    assert progress.line() == "generate, 0:00"
    progress.expect(16, "responses")
    clock.now += 4
    progress.add(done=3, tokens=2500)
    assert progress.counts() == PhaseCounts("generate", "responses", 16, 3, 2500, 4.0)
    assert progress.line() == "generate 3/16 responses, 2.5k tokens, 625 tok/s, 0:04"
    clock.now += 3600 + 62
    assert progress.line().endswith("1:01:06")


def test_a_new_phase_starts_from_zero():
    clock = FakeClock()
    progress = Progress(clock)
    progress.start("rl")
    progress.expect(4, "micro-batches")
    progress.add(done=2, tokens=1_500_000)
    clock.now += 2
    assert progress.line() == "rl 2/4 micro-batches, 1.5M tokens, 750.0k tok/s, 0:02"
    progress.start("judge")
    assert progress.counts() == PhaseCounts("judge", "", None, 0, 0, 0.0)
    assert progress.line() == "judge, 0:00"


def test_subscribers_see_every_change():
    progress = Progress(FakeClock())
    seen = []
    progress.subscribe(lambda c: seen.append((c.phase, c.total, c.done, c.tokens)))
    progress.start("validate")
    progress.expect(2, "responses")
    progress.add(done=1, tokens=7)
    progress.add(done=1, tokens=3)
    assert seen == [("validate", None, 0, 0), ("validate", 2, 0, 0), ("validate", 2, 1, 7), ("validate", 2, 2, 10)]


def test_ticker_redraws_from_its_own_thread_until_closed():
    redraws = []
    three = threading.Event()

    def redraw():
        redraws.append(threading.current_thread().name)
        if len(redraws) == 3:
            three.set()

    ticker = ProgressTicker(redraw, interval=0.01)
    assert three.wait(10)
    ticker.close()
    count = len(redraws)
    assert set(redraws) == {"oreal-progress"}
    threading.Event().wait(0.05)
    assert len(redraws) == count  # nothing after close


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_redraws_are_rarer_into_a_log_file():
    assert refresh_interval(Terminal()) == REFRESH_S < LOG_REFRESH_S == refresh_interval(io.StringIO())
