"""paddle.distributed.launch (fleetrun is the same entry point), with a limit on the wait for the other machines.

run.sh starts it as `python -m <package>.launcher [launch flags] --log_dir DIR run.py [ARGS]`.
The launcher runs in this very process, so signals reach it as they would reach the command.
Once every machine has joined, it starts the workers, and the first one's log, DIR/workerlog.0,
appears; if that has not happened JOIN_TIMEOUT seconds after the start, a machine is missing. Meanwhile
machine 0 says which machines the master has not heard from (roll_call.py), and the error names them.
A failed job ends with the status of the worker that failed, not of one that the launcher then stopped.
A collective that timed out ends in one line (roll_call.py), also where paddle ended the worker in C++.
"""

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .errors import (
    CHECK_FAILED_STATUS,
    COLLECTIVE_TIMEOUT_STATUS,
    STOPPED_STATUS,
    ended_quietly_by_ctrl_c,
    said,
    said_once_per_machine,
)
from .roll_call import RollCall, not_met, say_while_meeting

# How a worker ends that the launcher stops after another failed: SIGTERM, SIGKILL 3 s later, or its own status
# after a save on SIGTERM. (A worker that the kernel's OOM killer ends looks the same.)
_STOPPED_BY_THE_LAUNCHER = (STOPPED_STATUS, -signal.SIGTERM, -signal.SIGKILL)
# paddle's gloo gives up on a collective after a fixed 30 s. In the gradients' all-reduce, inside backward(), paddle
# then ends the worker in C++ (std::terminate: a C++ report, SIGABRT) before Python can say where; the report's
# first line names gloo's exception.
_GLOO_GAVE_UP = "gloo::TimeoutException"


def main() -> None:
    with ended_quietly_by_ctrl_c():  # paddle loads (as run.py's imports: Ctrl-C is quiet, so is its threads warning)
        import paddle.distributed.launch.main  # noqa: F401
    # While the machines gather, paddle logs each poll of the master (two a second) at INFO level.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    join_timeout = float(os.environ.get("JOIN_TIMEOUT", "0"))
    too_few: list[int] = []  # an elastic job's wait that ended without its fewest machines
    if join_timeout > 0:
        first_log = Path(sys.argv[sys.argv.index("--log_dir") + 1], "workerlog.0")
        fewest, elastic, most = _flag("--nnodes", "1").partition(":")
        roll = RollCall(int(most or fewest))
        threading.Thread(target=_give_up_unless_started, args=(first_log, join_timeout, roll), daemon=True).start()
        if elastic:  # etcd numbers the machines once they meet: until then, how many the job waits for
            threading.Thread(
                target=say_while_meeting, args=(first_log.exists, int(fewest), join_timeout), daemon=True
            ).start()
            _wait_for_the_fewest(join_timeout, too_few)
        if roll.nnodes > 1 and _flag("--rank", "") == "0":  # not in an elastic job: etcd numbers its machines
            threading.Thread(target=roll.watch, args=(_machines_at_the_master, join_timeout), daemon=True).start()
    # The ranks say each error once (errors.say()); process 0's go to the console with its log, the others' are said
    # here at the end. paddle's own report of a failed process (and the tail of its log) adds nothing to them.
    with said_once_per_machine() as errors_said:
        logging.getLogger("LAUNCH").addFilter(lambda record: _not_said_already(record, errors_said))
        _show_tails_of_the_unexplained(errors_said)
        try:
            _launch(join_timeout, too_few, errors_said)
        finally:
            for text, rank in said(errors_said).items():
                if rank != 0:
                    sys.stderr.write(text)


def _show_tails_of_the_unexplained(errors_said: Path) -> None:
    """When a process fails, paddle prints the tail of its log: not process 0's, which is on the console already, nor
    that of one that said its error."""
    from paddle.distributed.launch.job.container import Container

    tail = Container.tail

    def unexplained_tail(container, length=3000):
        if container.rank != 0 and not _gave_up_in_cpp(container.errfile):
            if container.rank not in said(errors_said).values():
                tail(container, length)

    Container.tail = unexplained_tail


def _launch(join_timeout: float, too_few: list[int], errors_said: Path) -> None:
    """paddle's launch(), its console relay up to a C++ report, its exit status the failed worker's."""
    from paddle.distributed.launch.job.container import Container
    from paddle.distributed.launch.job.pod import Pod
    from paddle.distributed.launch.main import launch

    # Process 0's log comes to the console through this, up to a C++ report of gloo giving up (said in one line).
    relay = Container.logs
    Container.logs = lambda one, fn=None, *args, **kwargs: relay(one, fn or _CONSOLE.of(one), *args, **kwargs)
    # Stopping it (a SIGTERM, another worker failed) paddle would close its log while it still writes: read on below.
    close = Container.terminate

    def terminate(one, force: bool = False) -> None:
        if one is _CONSOLE.container and one._log_handler is not None:
            _CONSOLE.unread, one._log_handler = one._log_handler, None
        close(one, force)

    Container.terminate = terminate
    # paddle ends with the status of the first worker, in rank order, that did not end with 0: often one that it
    # stopped itself after another had failed (-15, which the shell sees as 241), where the failure's own is wanted.
    paddles_status = Pod.exit_code.fget
    Pod.exit_code = property(lambda pod: _own_failure(pod) or paddles_status(pod))
    try:
        launch()
    except SystemExit:
        if too_few:  # a restart left fewer than the fewest, and none came within JOIN_TIMEOUT: paddle said status 0
            sys.exit(_not_joined(join_timeout))
        raise
    except Exception as error:  # an elastic job's etcd, whose client (etcd3) raises its own errors
        if not type(error).__module__.startswith("etcd3"):
            raise
        sys.exit(
            f"error: the etcd server at {_flag('--master', '').removeprefix('etcd://')} did not answer "
            f"({type(error).__name__}: {error}): start it, or set ETCD_ENDPOINT to one that this machine reaches"
        )
    finally:
        _CONSOLE.read_to_the_end()  # paddle has waited for the workers to end
        # (Where a worker failed on its own, saying why or in a traceback, the others' gloo gave up on it at once:
        # that failure is the job's.)
        logs = list(Path(_flag("--log_dir", ".")).glob("workerlog.*"))
        if any(map(_gave_up_in_cpp, logs)) and not said(errors_said) and not any(map(_python_traceback, logs)):
            sys.stderr.write(
                "error: a collective timed out in a training step: a rank did not answer for paddle's 30 s (gloo's "
                "fixed limit on CPUs, whatever --dist-timeout says), and paddle ended the ranks that waited, in the "
                "gradients' all-reduce, before they could say which step or rank: check the machines and their "
                "network (a process stopped, hung or out of memory, a machine down)\n"
            )


def _own_failure(pod) -> int:
    """The status of the first worker, in rank order, that failed on its own; else COLLECTIVE_TIMEOUT_STATUS where
    gloo gave up and paddle ended one in C++ (a worker that failed makes the others' gloo give up at once, as if
    they had waited 30 s); 0 where none failed."""
    failed = [container for container in pod.containers if container.exit_code not in (0, *_STOPPED_BY_THE_LAUNCHER)]
    own = [container.exit_code for container in failed if not _gave_up_in_cpp(container.errfile)]
    return own[0] if own else COLLECTIVE_TIMEOUT_STATUS if failed else 0


def _gave_up_in_cpp(log) -> bool:
    """Whether a worker's log (its path) ends in paddle's C++ report of a collective that gloo gave up on."""
    return _GLOO_GAVE_UP.encode() in _end_of(log)


def _python_traceback(log) -> bool:
    """Whether a worker's log ends in a Python traceback (a worker that failed on its own, not by gloo giving up)."""
    end = _end_of(log)
    return _GLOO_GAVE_UP.encode() not in end and (end.startswith(b"Traceback (") or b"\nTraceback (" in end)


def _end_of(log, size: int = 65536) -> bytes:
    try:
        with open(log, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - size))
            return file.read()
    except (OSError, TypeError):  # no log (yet), or none named
        return b""


def _not_said_already(record, errors_said: Path) -> bool:
    """False for paddle's "Container failed" report where a worker said why: its error line (errors.say()), each
    problem of a --check in its own line, a collective that timed out in one (or the launcher does, after paddle's
    C++ report)."""
    message = record.getMessage()
    if not message.startswith("Container failed"):
        return True
    explained = any(f" code {status} " in message for status in (CHECK_FAILED_STATUS, COLLECTIVE_TIMEOUT_STATUS))
    aborted = f" code {-signal.SIGABRT} " in message and _gave_up_in_cpp(message.rpartition(" log ")[2].strip())
    signalled = " code -" in message  # killed (the OOM killer's SIGKILL): no rank's line says that
    return not (explained or aborted or said(errors_said) and not signalled)


class _Console:
    """What paddle copies from process 0's log: to stdout, up to a C++ report of gloo giving up (until an elastic
    job's restart starts process 0 again)."""

    container, cut, unread = None, False, None

    def of(self, container) -> "_Console":
        if container is not self.container:
            self.container, self.cut = container, False
        return self

    def write(self, line: str) -> None:
        self.cut = self.cut or _GLOO_GAVE_UP in line
        if not self.cut:
            sys.stdout.write(line)

    def read_to_the_end(self) -> None:
        """The rest of a stopped process 0's log, which paddle would have left unread."""
        if self.unread is not None:
            for line in self.unread:
                self.write(line)
            self.unread.close()


_CONSOLE = _Console()


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
            sys.stderr.write(_not_joined(join_timeout, roll) + "\n")
            sys.stderr.flush()
            os._exit(1)  # from this thread, while launch() waits in the main one; no worker has started yet
        time.sleep(0.5)


def _not_joined(join_timeout: float, roll: RollCall | None = None) -> str:
    fewest, elastic, _ = _flag("--nnodes", "1").partition(":")
    if elastic:
        return not_met(int(fewest), join_timeout, "ETCD_ENDPOINT and JOB_ID")
    # Machine 0 knows which machines did not come; the others only that some did not.
    missing = f" ({roll.named()} did not)" if roll and _flag("--rank", "") == "0" and roll.missing else ""
    return (
        f"error: the machines did not all join within JOIN_TIMEOUT={join_timeout:g} s{missing}: start run.sh on "
        "every machine with the same NNODES, MASTER_ADDR and MASTER_PORT, or raise JOIN_TIMEOUT"
    )


def _wait_for_the_fewest(join_timeout: float, failed: list[int]) -> None:
    """Paddle's elastic launcher waits --elastic_timeout (also its wait after a loss, for stragglers) for its peers,
    then gives up and ends with status 0: wait up to JOIN_TIMEOUT for the fewest; `failed` says a wait that did not
    get them."""
    from paddle.distributed.launch.controllers.master import ETCDMaster

    wait = ETCDMaster.wait_peer_ready

    def wait_peer_ready(master, fewest: int, most: int, timeout: float) -> tuple[bool, int]:
        deadline = time.monotonic() + join_timeout
        while True:
            ready, count = wait(master, fewest, most, timeout)
            if ready or time.monotonic() >= deadline or master.ctx.status.is_done():
                if not ready:
                    failed.append(count)
                return ready, count

    ETCDMaster.wait_peer_ready = wait_peer_ready


if __name__ == "__main__":
    main()
