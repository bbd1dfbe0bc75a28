"""SIGTERM, what SLURM and Kubernetes send before they kill a job: stop at a step boundary, save, exit.

The signal only sets a flag. After optimizer steps the ranks vote (one tiny
all-reduce) whether any of them has been signalled, so that they all stop after
the same step; the loop then raises Stopped, which says where the epoch stands,
run.py saves that in one place, and the next start continues from that very step.

A vote stalls every rank for about a millisecond, a tenth of a small model's
step on CPU; so the ranks vote about once a second, after every step only when
steps take longer than that. A stop then comes at most a second, or one step,
after the signal.

The same vote carries whether a rank's training loss became NaN or infinite: then
every rank raises Diverged together, and nothing more is saved.
"""

import logging
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass

from . import distributed
from .errors import STOPPED_STATUS, UserError

log = logging.getLogger(__name__)

VOTES_PER_SECOND = 1


@dataclass
class EpochProgress:
    """How far this rank is into an epoch: the batches it has trained on, their loss sum and sample count, and
    the samples of the epoch's order all ranks together have trained (`consumed`, the same on every rank)."""

    step: int = 0
    loss_sum: float = 0.0
    seen: int = 0
    consumed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def batches_done(self, batch_size: int, world_size: int) -> int:
        """The epoch's batches done before a pass of `world_size` processes: the stop's own step on as many
        processes, or on another number (step 0 then) as many batches of this run as its samples make, so the
        steps of the epoch count on from there."""
        return self.step or self.consumed // (batch_size * world_size)


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


class Diverged(UserError):
    """The training loss became NaN or infinite: raised on every rank after the same step; rank 0 says it."""

    def __init__(self, epoch: int, step: int, shown: bool):
        super().__init__(
            f"the training loss became NaN or infinite in epoch {epoch} by step {step}: training stopped before "
            "saving it (earlier checkpoints are kept); try a lower --lr",
            shown,
        )


class StopRequest:
    """Set by SIGTERM once on_sigterm() made it the handler; stop_now() asks, on every rank together."""

    signalled = False

    def __init__(self):
        self.steps_per_vote = self.steps_to_vote = 1
        self.last_vote = time.perf_counter()
        self.on_signal = lambda: None  # what else a SIGTERM does at once (training.py: the folder's lock says it)

    @classmethod
    def on_sigterm(cls) -> "StopRequest":
        request = cls()
        signal.signal(signal.SIGTERM, request._set)
        return request

    def _set(self, signum, frame) -> None:
        self.signalled = True
        self.on_signal()

    def stop_now(self, env, vote_now: bool = False, loss_sum=0.0, where: tuple[int, int] = (0, 0)) -> bool:
        """Called on every rank after each optimizer step (and with vote_now at the end of an epoch).

        True on all ranks, after the same step, once a vote found any of them signalled. `loss_sum`,
        the epoch's running sum of this rank's loss (a number, or a tensor read only when the ranks
        vote: no wait at other steps), stays NaN or infinite once one loss was: then every rank raises
        Diverged, naming `where`: (epoch, step).
        """
        if not vote_now:
            self.steps_to_vote -= 1
            if self.steps_to_vote > 0:
                return self.signalled and env.world_size == 1  # one process needs no vote to stop
        # Whole milliseconds sum exactly in any order: every rank gets the same totals, so all of them
        # work out the same number of steps to the next vote.
        elapsed_ms = round(1000 * (time.perf_counter() - self.last_vote))
        signalled_ranks, total_ms, diverged_ranks = distributed.all_reduce_sum(
            [float(self.signalled), elapsed_ms, float(not math.isfinite(loss_sum))], env
        )
        if diverged_ranks:
            raise Diverged(*where, shown=env.local_rank == 0)
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
