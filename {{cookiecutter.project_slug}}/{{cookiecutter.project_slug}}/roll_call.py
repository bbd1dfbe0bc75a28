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

Elastic jobs (NNODES=MIN:MAX machines) go on when a machine is lost or joins: the launcher restarts every rank
(torchrun's c10d rendezvous; Paddle's launcher through etcd), and each resumes from the last save at the new world
size. What run.sh's platform step and the restarted ranks need to know about that is at the end: the range, whether
this bake can run one, a global batch that every allowed world size reaches, and the job's name (run.sh exports it
to the ranks as ELASTIC_JOB_ID, so that a restart knows its own job's folder lock).

Lifetimes (die_with_parent, end_with_the_rank): a rank and its loader workers end with the process that started
them, so that none trains on as an orphan, holding the output folder (a requeue or a restart would be refused) or a
GPU.
"""

import contextlib
import ctypes
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping

from . import settings
from .errors import COLLECTIVE_TIMEOUT_STATUS, PlatformError, UserError

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
    if job_id():
        then = "the elastic job restarts from the last save"
    else:
        then = "the job stops; run it again to resume from the last save"
        if settings.NODES == "multi" and settings.LAUNCHER in ELASTIC_LAUNCHERS[settings.FRAMEWORK]:
            then += " (an elastic job, NNODES=MIN:MAX, goes on)"
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


# Elastic jobs

JOB_ID_VARIABLE = "ELASTIC_JOB_ID"
ETCD_VARIABLE = "ETCD_ENDPOINT"
ELASTIC_LAUNCHERS = {"pytorch": ("torchrun",), "paddle": ("launch", "fleetrun")}  # those that run a range of machines


def machine_range(name: str, text: str) -> tuple[int, int]:
    """NNODES as (fewest, most) machines: "2" is (2, 2), "1:4" is (1, 4)."""
    low, colon, high = text.strip().partition(":")
    try:
        fewest, most = int(low), int(high if colon else low)
    except ValueError:
        fewest = most = 0
    if fewest < 1 or most < fewest:
        raise PlatformError(
            f"{name}={text!r} is not a whole number of 1 or more, nor a range MIN:MAX of machines (1 <= MIN <= MAX)"
        )
    return fewest, most


def refusal(framework: str, launcher: str, env: Mapping[str, str]) -> str | None:
    """Why this bake cannot run an elastic job here, or None."""
    if framework == "pytorch" and launcher not in ELASTIC_LAUNCHERS[framework]:
        return (
            f"an elastic job (a range of machines) runs with torchrun; this project was baked with launcher={launcher}: "
            "bake it again with launcher=torchrun, or give NNODES one number"
        )
    if framework == "paddle" and launcher not in ELASTIC_LAUNCHERS[framework]:
        return (
            "an elastic job (a range of machines) runs with Paddle's launch or fleetrun; this project was baked with "
            "launcher=spawn: bake it again with launcher=launch, or give NNODES one number"
        )
    if framework == "paddle" and not etcd_endpoint(env):
        return (
            f"an elastic Paddle job needs an etcd server that every machine reaches: set {ETCD_VARIABLE}=HOST:PORT "
            "(without it Paddle's launcher waits forever), or give NNODES one number"
        )
    if framework == "paddle" and importlib.util.find_spec("etcd3") is None:
        return "an elastic Paddle job talks to etcd through the etcd3 package: pip install etcd3"
    return None


def etcd_endpoint(env: Mapping[str, str]) -> str | None:
    """HOST:PORT of the etcd server: ETCD_ENDPOINT, or a PaddleJob's etcd:// master."""
    master = env.get("PADDLE_MASTER", "")
    return env.get(ETCD_VARIABLE) or (master.removeprefix("etcd://") if master.startswith("etcd://") else None)


def batch_refusal(global_batch: int | None, batch_size: int, nproc: int, fewest: int, most: int) -> str | None:
    """--global-batch-size G must be reachable by every world size a restart may bring, or said at the start."""
    if global_batch is None:
        return None
    missed = [machines for machines in range(fewest, most + 1) if global_batch % (batch_size * nproc * machines)]
    if not missed:
        return None
    sizes = ", ".join(str(machines * nproc) for machines in missed)
    return (
        f"--global-batch-size {global_batch} is not a multiple of --batch-size {batch_size} x the world size on "
        f"{'/'.join(map(str, missed))} machine(s) ({sizes} processes), which this elastic job of {fewest} to {most} "
        "machines may come to: choose a global batch that each reaches, or another --batch-size"
    )


def job_name(env: Mapping[str, str], package: str, port: int | None) -> str:
    """The elastic job's name, the same on every machine: JOB_ID, a Kubeflow job's name, else the project's and
    MASTER_PORT's (two jobs cannot share a port; with Paddle the name keeps jobs apart in etcd, nothing else does)."""
    return env.get("JOB_ID") or env.get("PET_RDZV_ID") or env.get("PADDLE_JOB_ID") or f"{package}-{port}"


def job_id() -> str | None:
    """The elastic job this rank belongs to (run.sh's ELASTIC_JOB_ID), or None outside one."""
    return os.environ.get(JOB_ID_VARIABLE) or None


def restart_line(saved_world: int, world: int, local_world: int, where: str) -> str:
    """The one line a rank 0 that resumes inside an elastic job logs: what changed, and from where it goes on."""
    change = "machine(s) lost" if world < saved_world else "machine(s) joined" if world > saved_world else "same size"
    machines = max(world // max(local_world, 1), 1)
    return (
        f"elastic job {job_id()}: now {machines} machine(s), world size {world} (the save's was {saved_world}: "
        f"{change}); resumed from {where}"
    )


def die_with_parent(parent_pid: int) -> None:
    """Linux: this process gets SIGKILL when `parent_pid`, its parent, dies (and leaves now if it has died)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before prctl() took effect
        os._exit(1)


def end_with_the_rank(worker_id: int) -> None:
    """The data loaders' worker_init_fn: a worker ends with its rank, and only then.

    torchrun, paddle's launcher and SLURM's scancel send SIGTERM to every process of a rank, its loader workers
    included. The rank takes it as "save after the next step"; a worker would die of it, and the rank, which
    needs batches until that step, would end with the framework's "worker killed" error instead of saving. So a
    SIGTERM from anybody but the rank is left to the rank; one from the rank (its way to end its workers) ends
    the worker at once, as the frameworks' own handlers do; a rank that dies takes its workers with it.
    """
    rank = os.getppid()
    die_with_parent(rank)
    if not hasattr(signal, "sigwaitinfo"):  # macOS: the framework's own handling stays
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started from here on block it too
    threading.Thread(target=_wait_for_the_ranks_sigterm, args=(rank,), daemon=True).start()


def _wait_for_the_ranks_sigterm(rank: int) -> None:
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != rank:
        pass
    os._exit(0)
