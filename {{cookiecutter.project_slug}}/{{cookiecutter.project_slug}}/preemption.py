"""SIGTERM, what SLURM and Kubernetes send before they kill a job: stop at a step boundary, save, exit.

The signal only sets a flag. After optimizer steps the ranks vote (one tiny
all-reduce) whether any of them has been signalled, so that they all stop after
the same step; the loop then raises Stopped, which says where the epoch stands,
run.py saves that in one place, and the next start continues from that very step.

A vote stalls every rank for about a millisecond, a tenth of a small model's
step on CPU; so the ranks vote about once a second, after every step only when
steps take longer than that. A stop then comes at most a second, or one step,
after the signal.
"""

import logging
import signal
import sys
import time

from . import distributed
from .errors import STOPPED_STATUS
from .state import EpochProgress

log = logging.getLogger(__name__)

VOTES_PER_SECOND = 1


class Stopped(Exception):
    """Raised on every rank after the same step once the ranks voted to stop.

    `epoch` is the epoch under way and `progress` this rank's part of it; a stop at an
    epoch's end is the next epoch at step 0 (the finished epoch is saved already).
    """

    def __init__(self, epoch: int, progress: EpochProgress):
        super().__init__(f"stopped in epoch {epoch} after step {progress.step}")
        self.epoch, self.progress = epoch, progress

    @property
    def where(self) -> str:
        return f"epoch {self.epoch} step {self.progress.step}" if self.progress.step else f"epoch {self.epoch - 1}"


class StopRequest:
    """Set by SIGTERM once on_sigterm() made it the handler; stop_now() asks, on every rank together."""

    signalled = False

    def __init__(self):
        self.steps_per_vote = self.steps_to_vote = 1
        self.last_vote = time.perf_counter()

    @classmethod
    def on_sigterm(cls) -> "StopRequest":
        request = cls()
        signal.signal(signal.SIGTERM, request._set)
        return request

    def _set(self, signum, frame) -> None:
        self.signalled = True

    def stop_now(self, env, vote_now: bool = False) -> bool:
        """Called on every rank after each optimizer step (and with vote_now at the end of an epoch).

        True on all ranks, after the same step, once a vote found any of them signalled.
        """
        if env.world_size == 1:
            return self.signalled
        if not vote_now:
            self.steps_to_vote -= 1
            if self.steps_to_vote > 0:
                return False
        # Whole milliseconds sum exactly in any order: every rank gets the same totals, so all of them
        # work out the same number of steps to the next vote.
        elapsed_ms = round(1000 * (time.perf_counter() - self.last_vote))
        signalled_ranks, total_ms = distributed.all_reduce_sum([float(self.signalled), elapsed_ms], env)
        steps_done = self.steps_per_vote - self.steps_to_vote
        step_ms = total_ms / env.world_size / max(steps_done, 1)
        self.steps_per_vote = max(1, min(1000, int(1000 / VOTES_PER_SECOND // max(step_ms, 1))))
        self.steps_to_vote = self.steps_per_vote
        self.last_vote = time.perf_counter()
        return signalled_ranks > 0

    def after_epoch(self, env, epoch: int, last_epoch: int) -> None:
        """At the end of a saved epoch, on every rank: raise Stopped if a vote says so (not after the last)."""
        if epoch < last_epoch and self.stop_now(env, vote_now=True):
            raise Stopped(epoch + 1, EpochProgress())


def leave(stopped: Stopped, checkpoint) -> None:
    """End this rank after the stop checkpoint is saved, with STOPPED_STATUS."""
    log.info("stopped by SIGTERM after %s; saved %s; run.sh again continues from there", stopped.where, checkpoint)
    # Rank 0 may still be writing: a launcher stops every rank as soon as one of them exits.
    distributed.barrier()
    sys.exit(STOPPED_STATUS)
