"""The training command line as a subprocess test runs it: ``python cli_driver.py CONFIG [--key value ...]``.

Two stand-ins, both set by environment variables, so a test can signal the run at a known point:
  - the judger is replaced by a rule on the response text (+1 when its length is even), so some
    groups are mixed and the RL phase trains, without judge worker processes;
  - ``HOLD=PHASE:STEP:DIR`` holds the run right after it enters PHASE of 1-based STEP: it creates
    ``DIR/held`` and waits until ``DIR/go`` exists (at most 120 s), then goes on; while it waits it
    creates ``DIR/signalled`` once the run's signal handler has seen a (first) signal.
Everything else is the real command line: config, signal handling, checkpoints, exit codes.
"""

from __future__ import annotations

import os
import sys
import time

from oreal_fast import trainer
from oreal_fast.judge import JudgeOutcome
from oreal_fast.train import main


class EvenLengthRouter:
    def __init__(self, judgers_config, data_judger_mapping, reward_fn=None):
        pass

    def judge(self, items):
        rewards = [1.0 if len(it.response_text) % 2 == 0 else -1.0 for it in items]
        return JudgeOutcome(rewards=rewards, counters={"rule_confirmed": sum(r > 0 for r in rewards)})

    def live_workers(self):
        return 0  # no worker processes

    def close(self):
        pass


def hold_at(phase: str, step: int, folder: str) -> None:
    """Wraps Trainer.step and Trainer._phase so that entering ``phase`` of ``step`` waits for ``go``."""
    current = {"step": 0}
    step_fn, phase_fn = trainer.Trainer.step, trainer.Trainer._phase

    def step_wrapper(self, s):
        current["step"] = s + 1
        return step_fn(self, s)

    def phase_wrapper(self, name):
        phase_fn(self, name)
        if (name, current["step"]) == (phase, step):
            open(os.path.join(folder, "held"), "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
                if self.stop.signum is not None and not os.path.exists(os.path.join(folder, "signalled")):
                    open(os.path.join(folder, "signalled"), "w").close()
                time.sleep(0.01)

    trainer.Trainer.step, trainer.Trainer._phase = step_wrapper, phase_wrapper


if __name__ == "__main__":
    trainer.Router = EvenLengthRouter
    if os.environ.get("HOLD"):
        phase, step, folder = os.environ["HOLD"].split(":", 2)
        hold_at(phase, int(step), folder)
    main(sys.argv[1:])
