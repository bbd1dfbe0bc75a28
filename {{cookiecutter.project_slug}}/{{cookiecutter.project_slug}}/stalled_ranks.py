"""A collective that timed out mid-run: one error line that says where the job stood and which ranks stopped answering.

A rank that is stopped (SIGSTOP), hung, or on a machine that froze or lost its network joins no collective: the
other ranks wait in one until the backend gives up, each at about the same moment. Then each of them checks in at
the rendezvous store (served by the launcher on machine 0, or by rank 0's process): the first to come waits up to
CHECK_IN_S for the others and names those that never came; the others end quietly. All of them end with
COLLECTIVE_TIMEOUT_STATUS, which the launchers pass on without a line of their own.
"""

import signal
import threading
import time
from collections.abc import Callable

from . import elastic
from .errors import COLLECTIVE_TIMEOUT_STATUS, UserError

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
