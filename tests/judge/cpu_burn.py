"""Rule checks for the pool tests, run by the workers as ``cpu_burn:<function>``."""

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
