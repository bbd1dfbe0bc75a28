"""paddle.distributed.launch (fleetrun is the same entry point), with a limit on the wait for the other machines.

run.sh starts it as `python -m <package>.launcher [launch flags] --log_dir DIR run.py [ARGS]`.
The launcher runs in this very process, so signals reach it as they would reach the command.
Once every machine has joined, it starts the workers, and the first one's log, DIR/workerlog.0,
appears; if that has not happened JOIN_TIMEOUT seconds after the start, a machine is missing. Meanwhile
machine 0 says which machines the master has not heard from (roll_call.py), and the error names them.
A failed job ends with the status of the worker that failed, not of one that the launcher then stopped.
"""

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .errors import CHECK_FAILED_STATUS, STOPPED_STATUS
from .roll_call import RollCall

# How a worker ends that the launcher stops after another failed: SIGTERM, SIGKILL 3 s later, or its own status
# after a save on SIGTERM. (A worker that the kernel's OOM killer ends looks the same.)
_STOPPED_BY_THE_LAUNCHER = (STOPPED_STATUS, -signal.SIGTERM, -signal.SIGKILL)


def main() -> None:
    # While the machines gather, paddle logs each poll of the master (two a second) at INFO level.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # A --check that found problems said each in its own line: paddle's "Container failed" report only repeats it.
    logging.getLogger("LAUNCH").addFilter(lambda record: f" code {CHECK_FAILED_STATUS} " not in record.getMessage())
    join_timeout = float(os.environ.get("JOIN_TIMEOUT", "0"))
    if join_timeout > 0:
        first_log = Path(sys.argv[sys.argv.index("--log_dir") + 1], "workerlog.0")
        roll = RollCall(int(_flag("--nnodes", "1").rpartition(":")[2]))  # an elastic job's: its most machines
        threading.Thread(target=_give_up_unless_started, args=(first_log, join_timeout, roll), daemon=True).start()
        if roll.nnodes > 1 and _flag("--rank", "") == "0":  # not in an elastic job: etcd numbers its machines
            threading.Thread(target=roll.watch, args=(_machines_at_the_master, join_timeout), daemon=True).start()
    from paddle.distributed.launch.job.container import Container
    from paddle.distributed.launch.job.pod import Pod
    from paddle.distributed.launch.main import launch

    # When a process fails, paddle prints the tail of its log. Process 0's log is on the console already: its
    # error line would show twice.
    tail = Container.tail
    Container.tail = lambda container, length=3000: None if container.rank == 0 else tail(container, length)
    # paddle ends with the status of the first worker, in rank order, that did not end with 0: often one that it
    # stopped itself after another had failed (-15, which the shell sees as 241), where the failure's own is wanted.
    paddles_status = Pod.exit_code.fget
    Pod.exit_code = property(lambda pod: _own_failure(pod) or paddles_status(pod))
    launch()


def _own_failure(pod) -> int:
    """The status of the first worker, in rank order, that failed on its own; 0 where none did."""
    statuses = (container.exit_code for container in pod.containers)
    return next((status for status in statuses if status not in (0, *_STOPPED_BY_THE_LAUNCHER)), 0)


def _flag(name: str, default: str) -> str:
    """A launch flag's value as run.sh passed it (`--name value`), before paddle parses them."""
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def _machines_at_the_master() -> set[int]:
    """The NODE_RANKs of the machines whose launchers have reached the master (their keys /JOB/info/POD/RANK)."""
    from paddle.distributed.launch.utils.kv_client import KVClient

    peers = KVClient(_flag("--master", "")).get_prefix(f"/{_flag('--job_id', 'default')}/info") or {}
    ranks = (key.rstrip("/").rpartition("/")[2] for key in peers)
    return {int(rank) for rank in ranks if rank.isdigit()}


def _give_up_unless_started(first_log: Path, join_timeout: float, roll: RollCall) -> None:
    deadline = time.monotonic() + join_timeout
    while not first_log.exists():
        if time.monotonic() > deadline:
            # Machine 0 knows which machines did not come; the others only that some did not.
            missing = f" ({roll.named()} did not)" if _flag("--rank", "") == "0" and roll.missing else ""
            sys.stderr.write(
                f"error: the machines did not all join within JOIN_TIMEOUT={join_timeout:g} s{missing}: start run.sh "
                "on every machine with the same NNODES, MASTER_ADDR and MASTER_PORT, or raise JOIN_TIMEOUT\n"
            )
            sys.stderr.flush()
            os._exit(1)  # from this thread, while launch() waits in the main one; no worker has started yet
        time.sleep(0.5)


if __name__ == "__main__":
    main()
