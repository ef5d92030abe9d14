"""CPU load for the rule-pool tests: a check the workers run as ``cpu_load:burn``, and busy processes
that compete with them for the cores. A plain module (not conftest.py) so that the workers can import
it and so that it imports the same whichever test folders one pytest run collects."""

import os
import subprocess
import sys
import time


def burn(text: str, gold: str) -> bool:
    """Busy-loop until this process has used ``float(text)`` CPU seconds in this call; True.

    process_time counts CPU time, not waiting for a core, so the work is the same on an idle
    machine and on a loaded one.
    """
    start = time.process_time()
    while time.process_time() - start < float(text):
        pass
    return True


class BusyMachine:
    """Three busy-looping processes (more than CI's two cores) competing with the code under test
    for the CPU while the ``with`` block runs."""

    def __enter__(self) -> "BusyMachine":
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
        return self

    def cpu_seconds(self) -> float:
        """CPU time the busy processes have used so far (proof that the load was there)."""
        total = 0
        for p in self.procs:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # from field 3 (state) on
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
        return total / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
