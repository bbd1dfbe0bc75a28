"""torchrun or torch.distributed.launch, ending a failed job with one line instead of a traceback.

run.sh starts it as `python -m <package>.launcher [launcher flags] run.py [ARGS]`; settings.LAUNCHER says which.
The launcher runs in this very process, so signals reach it as they would reach torchrun. When
a worker fails, its own error is already on the console; the launcher's traceback and report box
after it only bury that line.
"""

import logging
import sys
import warnings

from torch.distributed import DistStoreError
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from .errors import CHECK_FAILED_STATUS, STOPPED_STATUS
from .settings import LAUNCHER


def main() -> None:
    if LAUNCHER == "launch":
        # Deprecated upstream, still what some platforms call: its notice says nothing about this run.
        warnings.filterwarnings("ignore", category=FutureWarning)
        from torch.distributed.launch import main as start
    else:
        from torch.distributed.run import main as start
    # Its log lines on a failure or a SIGTERM (stopping the workers, the exit code) repeat what the
    # workers and this module print. Each of its modules sets its own logger's level.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        start()  # parses sys.argv, as the command would
    except SignalException:
        # The workers heard it too, saved and printed where they stopped.
        sys.exit(STOPPED_STATUS)
    except ChildFailedError as failure:
        rank, first = failure.get_first_failure()
        # The workers were signalled themselves (SLURM signals every process), or said each problem of a --check.
        if first.exitcode in (STOPPED_STATUS, CHECK_FAILED_STATUS):
            sys.exit(first.exitcode)
        how = f"signal {first.signal_name()}" if first.exitcode < 0 else f"status {first.exitcode}"
        sys.exit(f"error: rank {rank} stopped with {how} (its own error is above); the whole job was stopped")
    except DistStoreError as error:
        sys.exit(
            f"error: the machines did not all join: {error} Start run.sh on every machine with the same NNODES, "
            "MASTER_ADDR and MASTER_PORT, or raise JOIN_TIMEOUT"
        )


if __name__ == "__main__":
    main()
