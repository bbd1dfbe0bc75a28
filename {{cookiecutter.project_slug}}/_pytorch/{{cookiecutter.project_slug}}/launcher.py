"""torchrun or torch.distributed.launch, ending a failed job with one line instead of a traceback.

run.sh starts it as `python -m <package>.launcher [launcher flags] run.py [ARGS]`; settings.LAUNCHER says which.
The launcher runs in this very process, so signals reach it as they would reach torchrun. When
a worker fails, its own error is already on the console; the launcher's traceback and report box
after it only bury that line.

While the machines gather, each machine's launcher writes its NODE_RANK in the rendezvous store on machine 0,
whose launcher says every 30 s which machines it still waits for (roll_call.py); the error names them.
"""

import argparse
import logging
import sys
import threading
import time
import warnings
from datetime import timedelta

from torch.distributed import DistNetworkError, DistStoreError, TCPStore
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from .errors import CHECK_FAILED_STATUS, STOPPED_STATUS
from .machine_checks import wait_for_port
from .roll_call import RollCall
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
    roll = _start_roll_call(sys.argv[1:])
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
    # Another machine never came, or (DistNetworkError, on machines 1..) machine 0's store never listened.
    except (DistStoreError, DistNetworkError) as error:
        missing = f" {roll.named()} did not." if roll and roll.missing else ""
        sys.exit(
            f"error: the machines did not all join: {error}{missing} Start run.sh on every machine with the same "
            "NNODES, MASTER_ADDR and MASTER_PORT, or raise JOIN_TIMEOUT"
        )


def _start_roll_call(argv: list[str]) -> RollCall | None:
    """On a job of several machines: this machine's NODE_RANK into the store, and on machine 0 the watch."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--node_rank", "--node-rank", type=int, default=0)
    parser.add_argument("--master_addr", "--master-addr")
    parser.add_argument("--master_port", "--master-port", type=int)
    parser.add_argument("--rdzv-conf", "--rdzv_conf", default="timeout=900")
    flags = parser.parse_known_args(argv)[0]
    if not flags.nnodes.isdigit() or int(flags.nnodes) < 2:
        return None
    roll = RollCall(int(flags.nnodes))
    join_timeout = float(flags.rdzv_conf.partition("timeout=")[2] or 900)

    # The store is torchrun's own, up once machine 0's launcher starts; each thread has a client of its own.
    def connect() -> TCPStore:
        if not wait_for_port(flags.master_addr, flags.master_port, wait_s=0):  # a client would print C++ stacks
            raise ConnectionRefusedError(f"nothing listens on {flags.master_addr}:{flags.master_port} yet")
        return TCPStore(flags.master_addr, flags.master_port, is_master=False, timeout=timedelta(seconds=5))

    def say_here() -> None:
        while True:
            try:
                connect().set(f"{_KEY}/{flags.node_rank}", "here")
                return
            except (OSError, RuntimeError):  # not up yet (RuntimeError: torch's DistNetworkError)
                time.sleep(1.0)

    threading.Thread(target=say_here, daemon=True).start()
    if flags.node_rank != 0:
        return None  # machine 0 alone knows who came
    clients = []

    def present() -> set[int]:
        try:
            clients[:] = clients or [connect()]
            return {machine for machine in range(roll.nnodes) if clients[0].check([f"{_KEY}/{machine}"])}
        except (OSError, RuntimeError):
            return set()

    threading.Thread(target=roll.watch, args=(present, join_timeout), daemon=True).start()
    return roll


_KEY = "roll_call"


if __name__ == "__main__":
    main()
