"""SIGTERM, what SLURM and Kubernetes send before they kill a job: stop at the next step, save, exit.

The signal only sets a flag. At every optimizer step the ranks agree (one tiny
all-reduce) whether any of them has been signalled, so they all stop after the
same step; the loop then hands back where the epoch stands, run.py saves it,
and the next start continues from that very step.
"""

import logging
import signal
import sys
from dataclasses import asdict, dataclass

from . import distributed
from .errors import STOPPED_STATUS

log = logging.getLogger(__name__)


@dataclass
class EpochProgress:
    """How far this rank is into an epoch: the batches it has trained on, their loss sum and sample count."""

    step: int = 0
    loss_sum: float = 0.0
    seen: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class StopRequest:
    """Set by SIGTERM once on_sigterm() made it the handler; stop_now() is the step-boundary check, a collective."""

    signalled = False

    @classmethod
    def on_sigterm(cls) -> "StopRequest":
        request = cls()
        signal.signal(signal.SIGTERM, request._set)
        return request

    def _set(self, signum, frame) -> None:
        self.signalled = True

    def stop_now(self, env) -> bool:
        if env.world_size == 1:
            return self.signalled
        (signalled_ranks,) = distributed.all_reduce_sum([float(self.signalled)], env)
        return signalled_ranks > 0


def leave(epoch: int, progress: EpochProgress, checkpoint) -> None:
    """End this rank after the stop checkpoint is saved, with STOPPED_STATUS."""
    where = f"epoch {epoch} step {progress.step}" if progress.step else f"epoch {epoch}"
    log.info("stopped by SIGTERM after %s; saved %s; run.sh again continues from there", where, checkpoint)
    # Rank 0 may still be writing: a launcher stops every rank as soon as one of them exits.
    distributed.barrier()
    sys.exit(STOPPED_STATUS)
