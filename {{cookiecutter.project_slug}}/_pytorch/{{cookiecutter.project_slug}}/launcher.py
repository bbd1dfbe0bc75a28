"""torchrun or torch.distributed.launch, ending a failed job with one line instead of a traceback.

run.sh starts it as `python -m <package>.launcher [launcher flags] run.py [ARGS]`; settings.LAUNCHER says which.
The launcher runs in this very process, so signals reach it as they would reach torchrun. When
a worker fails, its own error is already on the console; the launcher's traceback and report box
after it only bury that line.

While the machines gather, machine 0's launcher says every 30 s which machines it still waits for
(distributed.store_roll_call()); the error names them.
"""

import argparse
import logging
import os
import sys
import threading
import warnings

from .errors import ended_quietly_by_ctrl_c

with ended_quietly_by_ctrl_c():  # while torch loads
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousTimeoutError

    from .distributed import store_roll_call
from .errors import CHECK_FAILED_STATUS, COLLECTIVE_TIMEOUT_STATUS, STOPPED_STATUS, said, said_once_per_machine
from .hardware import master_silent, wait_for_port
from .roll_call import RollCall, not_met, say_while_meeting
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
    # torchrun gives its workers 1 (a collective that times out ends the process in a C++ report) where it is unset:
    # 2, as distributed.setup() wants, unless the user chose.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    flags = _flags(sys.argv[1:])
    roll = _start_roll_call(flags)
    try:
        with said_once_per_machine() as errors_said:  # the ranks' identical error lines, said once
            try:
                start()  # parses sys.argv, as the command would
            except ChildFailedError as failure:
                _end_failed_job(failure, errors_said)
    except SignalException:
        # The workers heard it too, saved and printed where they stopped.
        sys.exit(STOPPED_STATUS)
    # An elastic job's rendezvous, hosted by machine 0's launcher: never met, or gone with that machine.
    except RendezvousTimeoutError:
        sys.exit(not_met(flags.machines, flags.join_timeout, "MASTER_ADDR and MASTER_PORT"))
    except RendezvousError as error:
        sys.exit(
            f"error: the elastic job's rendezvous failed: {error} Machine 0 (MASTER_ADDR) hosts it: a job goes on "
            "without any other machine, not without that one; start it again there, and on the others"
        )
    # Another machine never came, or (DistNetworkError, on machines 1..) machine 0's store never listened.
    except (DistStoreError, DistNetworkError) as error:
        missing = f" {roll.named()} did not." if roll and roll.missing else ""
        sys.exit(
            f"error: the machines did not all join: {error}{missing} Start run.sh on every machine with the same "
            "NNODES, MASTER_ADDR and MASTER_PORT, or raise JOIN_TIMEOUT"
        )


def _end_failed_job(failure: ChildFailedError, errors_said) -> None:
    """Exit with the failed rank's status; with a line of its own only where no rank said why."""
    rank, first = failure.get_first_failure()
    # The workers were signalled themselves (SLURM signals every process), said each problem of a --check, or
    # said once that a collective timed out (the first to fail is one that waited, not the one that stopped).
    if first.exitcode in (STOPPED_STATUS, CHECK_FAILED_STATUS, COLLECTIVE_TIMEOUT_STATUS):
        sys.exit(first.exitcode)
    if said(errors_said) and first.exitcode > 0:  # a rank's error line explains the stop (a signal, not always)
        sys.exit(first.exitcode)
    how = f"signal {first.signal_name()}" if first.exitcode < 0 else f"status {first.exitcode}"
    sys.exit(f"error: rank {rank} stopped with {how} (its own error is above); the whole job was stopped")


def _flags(argv: list[str]) -> argparse.Namespace:
    """The launcher flags this module needs, as run.sh gives them."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--node_rank", "--node-rank", type=int, default=0)
    parser.add_argument("--master_addr", "--master-addr")
    parser.add_argument("--master_port", "--master-port", type=int)
    parser.add_argument("--rdzv-conf", "--rdzv_conf", default="timeout=900")
    flags = parser.parse_known_args(argv)[0]
    conf = dict(item.partition("=")[::2] for item in flags.rdzv_conf.split(","))  # an elastic job's: join_timeout
    flags.join_timeout = float(conf.get("join_timeout") or conf.get("timeout") or 900)
    machines, flags.elastic, _ = flags.nnodes.partition(":")
    flags.machines = int(machines)  # a fixed job's, an elastic job's fewest
    return flags


def _start_roll_call(flags: argparse.Namespace) -> RollCall | None:
    """On a job of several machines: this machine's NODE_RANK into the store, and on machine 0 the watch; on an
    elastic job's machines, until they first meet, how many it waits for."""
    if flags.elastic:
        _say_while_meeting(flags.machines, flags.join_timeout)
        return None
    if flags.machines < 2:
        return None
    # Machine 0's launcher serves the store: a client that cannot connect prints C++ stacks, and waits twice as long.
    if flags.node_rank != 0 and not wait_for_port(flags.master_addr, flags.master_port, flags.join_timeout):
        waited = f"JOIN_TIMEOUT={flags.join_timeout:g} s"
        sys.exit(f"error: {master_silent(flags.master_addr, flags.master_port, waited)}")
    return store_roll_call(flags.master_addr, flags.master_port, flags.machines, flags.node_rank, flags.join_timeout)


def _say_while_meeting(fewest: int, join_timeout: float) -> None:
    """roll_call.say_while_meeting() until torchrun's first rendezvous returns (its restarts meet quietly)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    meet, met = DynamicRendezvousHandler.next_rendezvous, threading.Event()

    def next_rendezvous(handler):
        try:
            return meet(handler)
        finally:
            met.set()

    DynamicRendezvousHandler.next_rendezvous = next_rendezvous
    threading.Thread(target=say_while_meeting, args=(met.is_set, fewest, join_timeout), daemon=True).start()


if __name__ == "__main__":
    main()
