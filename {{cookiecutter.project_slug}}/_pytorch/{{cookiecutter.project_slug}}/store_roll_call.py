"""roll_call.py's question in torch's rendezvous store: each machine writes its NODE_RANK there, machine 0 reads.

The store is the one the launcher (torchrun, torch.distributed.launch) or, with spawn, rank 0's process group
serves on MASTER_PORT: no port more. A client without a world size is not counted among the store's workers.
"""

import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

from .machine_checks import wait_for_port
from .roll_call import RollCall

KEY = "roll_call"


def start(
    master_addr: str, master_port: int, nnodes: int, node_rank: int, join_timeout_s: float, limit: str = "JOIN_TIMEOUT"
) -> RollCall | None:
    """This machine's NODE_RANK into the store once it listens; on machine 0 also the watch (its lines name the
    wait's `limit`), whose RollCall is returned (None elsewhere: machine 0 alone knows who came)."""

    def connect() -> TCPStore:  # each thread has a client of its own
        if not wait_for_port(master_addr, master_port, wait_s=0):  # a client that cannot connect prints C++ stacks
            raise ConnectionRefusedError(f"nothing listens on {master_addr}:{master_port} yet")
        return TCPStore(master_addr, master_port, is_master=False, timeout=timedelta(seconds=5))

    def say_here() -> None:
        while True:
            try:
                connect().set(f"{KEY}/{node_rank}", "here")
                return
            except (OSError, RuntimeError):  # not up yet (RuntimeError: torch's DistNetworkError)
                time.sleep(1.0)

    threading.Thread(target=say_here, daemon=True).start()
    if node_rank != 0:
        return None
    roll, clients = RollCall(nnodes), []

    def present() -> set[int]:
        try:
            clients[:] = clients or [connect()]
            return {machine for machine in range(nnodes) if clients[0].check([f"{KEY}/{machine}"])}
        except (OSError, RuntimeError):
            return set()

    threading.Thread(target=roll.watch, args=(present, join_timeout_s, limit), daemon=True).start()
    return roll
