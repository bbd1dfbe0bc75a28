"""torchrun or torch.distributed.launch, ending a failed job with one line instead of a traceback.

run.sh starts it as `python -m <package>.launcher torchrun|launch [launcher flags] run.py [ARGS]`.
The launcher runs in this very process, so signals reach it as they would reach torchrun. When
a worker fails, its own error is already on the console; the launcher's traceback and report box
after it only bury that line.
"""

import logging
import sys
import warnings

from torch.distributed import DistStoreError
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def main(launcher: str) -> None:
    # Its log lines on a failure (stopping the other workers, the exit code) repeat the line printed below.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    if launcher == "launch":
        # Deprecated upstream, still what some platforms call: its notice says nothing about this run.
        warnings.filterwarnings("ignore", category=FutureWarning)
        from torch.distributed.launch import main as start
    else:
        from torch.distributed.run import main as start
    try:
        start()  # parses sys.argv, as the command would
    except ChildFailedError as failure:
        rank, first = failure.get_first_failure()
        how = f"signal {first.signal_name()}" if first.exitcode < 0 else f"status {first.exitcode}"
        sys.exit(f"error: rank {rank} stopped with {how} (its own error is above); the whole job was stopped")
    except DistStoreError as error:
        sys.exit(
            f"error: the machines did not all join: {error} Start run.sh on every machine with the same NNODES, "
            "MASTER_ADDR and MASTER_PORT, or raise JOIN_TIMEOUT"
        )


if __name__ == "__main__":
    main(sys.argv.pop(1))
