"""Processes that end with the one that started them: no rank or loader worker trains on as an orphan, holding
the output folder (a requeue or a restart would be refused) or a GPU."""

import contextlib
import ctypes
import os
import signal
import sys
import threading


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
