"""No silent wait, and no nameless one: while the machines of a job gather, machine 0 says which ones it still waits
for; when a collective times out mid-run, one error line says where the job stood and which ranks stopped
answering.

The machines (RollCall): each launcher (launcher.py) knows, in its own way, which machines have come: paddle's
master holds one key per machine, torchrun's store holds the one each machine's launcher writes. It hands a
`present` function to watch(), which asks it once a second and says, every REPORT_EVERY_S seconds, who is missing;
the error line at JOIN_TIMEOUT names them from the last answer (an elastic job, whose machines have no number yet:
how many).

The ranks (explained()): a rank that is stopped (SIGSTOP), hung, or on a machine that froze or lost its network
joins no collective: the other ranks wait in one until the backend gives up, each at about the same moment. Then
each of them checks in at the rendezvous store (served by the launcher on machine 0, or by rank 0's process): the
first to come waits up to CHECK_IN_S for the others and names those that never came; the others end quietly. All
of them end with COLLECTIVE_TIMEOUT_STATUS, which the launchers pass on without a line of their own.
"""

import signal
import sys
import threading
import time
from collections.abc import Callable

from . import elastic
from .errors import COLLECTIVE_TIMEOUT_STATUS, UserError

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


CHECK_IN_S = 5.0  # ranks that wait in the same collective give up within this of each other
STORE_GRACE_S = 2.0  # and the store answers within this, or its host is down too
NAMED_AT_MOST = 8
_KEY = "dist_template.collective_timeout"


class CollectiveTimedOut(UserError):
    status = COLLECTIVE_TIMEOUT_STATUS


def explained(
    where: str, limit: str, remedy: str, rank: int, world_size: int, add: Callable[[str, int], int]
) -> CollectiveTimedOut:
    """The error of this rank, whose collective gave up after `limit` in `where` (the epoch and step); `remedy`
    says how to give a slow rank longer. `add(key, amount)` is the rendezvous store's counter."""
    answer = _roll_call(rank, world_size, add)
    if answer is None:  # the store's host (machine 0, or rank 0) may be the one that stopped
        first, who, check = True, "another rank did not answer, nor did the rendezvous store,", "check machine 0"
    else:
        first, silent = answer
        who, check = _named(silent), f"check {'its machine' if len(silent) == 1 else 'their machines'} and network"
        if not silent:  # every rank came to the store but waited in the collective
            who, check = "every rank waited for another", "check the network between the machines"
    return CollectiveTimedOut(
        f"a collective timed out in {where}: {who} for {limit}: {check} (a process stopped, hung or out of memory, "
        f"a machine down); {remedy}",
        shown=first,
    )


def peer_gone(where: str, shown: bool) -> CollectiveTimedOut:
    """The error of a rank whose collective in `where` lost its connection to another rank: that rank's process, or
    its machine, is gone (said once per machine: `shown`)."""
    then = (
        "the elastic job restarts from the last save"
        if elastic.job_id()
        else "the job stops; run it again to resume from the last save (an elastic job, NNODES=MIN:MAX, goes on)"
    )
    return CollectiveTimedOut(
        f"a collective failed in {where}: another rank closed its connection (its process or its machine is gone, "
        f"its own error, if any, is in its log); {then}",
        shown=shown,
    )


def _named(ranks: list[int]) -> str:
    listed = ", ".join(map(str, ranks[:NAMED_AT_MOST]))
    more = f" and {len(ranks) - NAMED_AT_MOST} more" if len(ranks) > NAMED_AT_MOST else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}{more} did not answer"


def _roll_call(rank: int, world_size: int, add: Callable[[str, int], int]) -> tuple[bool, list[int]] | None:
    """(whether this rank checked in first, the ranks that never did: asked by the first only, the one that speaks);
    None where the store did not answer within CHECK_IN_S and STORE_GRACE_S (its host may be the one that stopped:
    the call is left waiting)."""
    answer = []

    def ask() -> None:
        # A signal that lands while the store's client waits for a reply can fail the call: the main thread takes it.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            add(f"{_KEY}.{rank}", 1)
            first = add(f"{_KEY}.count", 1) == 1
            deadline = time.monotonic() + CHECK_IN_S
            # The others wait too: the first must say it before a launcher stops the job on the first rank to end.
            while add(f"{_KEY}.count", 0) < world_size and time.monotonic() < deadline:
                time.sleep(0.1)
            answer.append((first, [other for other in range(world_size) if first and not add(f"{_KEY}.{other}", 0)]))
        except Exception:  # whatever the store raises (torch's DistError, paddle's RuntimeError): no answer
            return

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(CHECK_IN_S + STORE_GRACE_S)
    return answer[0] if answer else None
