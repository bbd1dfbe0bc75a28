"""No silent wait: while the machines of a job gather, machine 0 says which ones it still waits for (an elastic
job, whose machines have no number yet: how many).

Each launcher (launcher.py) knows, in its own way, which machines have come: paddle's master holds one key per
machine, torchrun's store holds the one each machine's launcher writes. It hands a `present` function to
watch(), which asks it once a second and says, every REPORT_EVERY_S seconds, who is missing; the error line
at JOIN_TIMEOUT names them from the last answer.
"""

import sys
import time
from collections.abc import Callable

FIRST_REPORT_S = 5.0  # machines started together need a few seconds: a line before then says nothing useful
REPORT_EVERY_S = 30.0
# The launcher takes its store down at JOIN_TIMEOUT: torch's client, asking then, prints a C++ stack. The last
# answer before this margin names the missing machines.
QUIET_BEFORE_TIMEOUT_S = 2.0


class RollCall:
    def __init__(self, nnodes: int):
        self.nnodes = nnodes
        self.missing = list(range(1, nnodes))  # machine 0 is the one asking

    def watch(
        self, present: Callable[[], set[int]], join_timeout_s: float, limit: str = "JOIN_TIMEOUT", poll_s: float = 1.0
    ) -> None:
        """Until every machine is present, a line every REPORT_EVERY_S (the first after FIRST_REPORT_S)."""
        started = time.monotonic()
        next_report = started + FIRST_REPORT_S
        while self.missing and time.monotonic() < started + join_timeout_s - QUIET_BEFORE_TIMEOUT_S:
            try:
                here = present()
            except OSError:  # the store or the master is not up yet: nobody has come
                here = set()
            self.missing = [machine for machine in range(self.nnodes) if machine not in here | {0}]
            now = time.monotonic()
            if self.missing and now >= next_report:
                sys.stderr.write(f"{self.waiting_for()} ({now - started:.0f} s of {limit}={join_timeout_s:g} s)\n")
                sys.stderr.flush()
                next_report = now + REPORT_EVERY_S
            time.sleep(poll_s)

    def waiting_for(self) -> str:
        return f"waiting for {self.named()} to join"

    def named(self) -> str:
        """The NODE_RANK of each machine that has not come: "machine 1 of 2", "machines 1, 3 of 4"."""
        noun = "machine" if len(self.missing) == 1 else "machines"
        return f"{noun} {', '.join(map(str, self.missing))} of {self.nnodes}"


def say_while_meeting(met: Callable[[], bool], fewest: int, join_timeout_s: float, poll_s: float = 1.0) -> None:
    """An elastic job's machines are numbered only once they meet, so none can be named: until `met()`, say every
    REPORT_EVERY_S (the first after FIRST_REPORT_S) how many the job waits for, up to JOIN_TIMEOUT."""
    started = time.monotonic()
    next_report = started + FIRST_REPORT_S
    while not met() and time.monotonic() < started + join_timeout_s - QUIET_BEFORE_TIMEOUT_S:
        now = time.monotonic()
        if now >= next_report:
            sys.stderr.write(
                f"waiting for at least {fewest} machine(s) of this elastic job to meet ({now - started:.0f} s of "
                f"JOIN_TIMEOUT={join_timeout_s:g} s)\n"
            )
            sys.stderr.flush()
            next_report = now + REPORT_EVERY_S
        time.sleep(poll_s)


def not_met(fewest: int, join_timeout_s: float, meeting: str) -> str:
    """The error of an elastic job whose fewest machines did not meet; `meeting`: the variables they meet by."""
    return (
        f"error: fewer than {fewest} machine(s) of this elastic job met within JOIN_TIMEOUT={join_timeout_s:g} s: "
        f"start run.sh on more of them, with the same NNODES, {meeting}, or raise JOIN_TIMEOUT"
    )
