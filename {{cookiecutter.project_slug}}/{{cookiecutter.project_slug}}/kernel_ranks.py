"""The processes notebook.launch() starts from a Jupyter kernel: each runs train(args) as one rank and reports
through a pipe how it ended; the kernel watches them, stops them all when one fails or the stop button is
pressed, and leaves none behind."""

import contextlib
import io
import logging
import os
import signal
import socket
import sys
import time
import traceback
import warnings
from multiprocessing.connection import wait

from . import errors
from .errors import STOPPED_STATUS, UserError
from .roll_call import die_with_parent

# After a failure, the other ranks get this long to end on SIGTERM before they are killed.
FAILURE_GRACE_S = 3.0
# After the stop button, this long to save a checkpoint (the project's ranks save at the next step).
STOP_GRACE_S = 30.0

_kept_from_the_kernel: list = []  # objects a forked rank must never delete (their threads stayed in the kernel)


class RankFailed(RuntimeError):
    """A rank of launch() failed; the message is its error, `rank` says which one."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank

    def _render_traceback_(self) -> list[str]:
        """What a notebook shows of it (IPython asks for this): the rank's traceback where it crashed, else its error
        as run.sh prints it; not the kernel's frames into launch()."""
        if self.__cause__ is not None:
            return str(self.__cause__).splitlines()
        return reported_error(str(self))._render_traceback_()


def reported_error(text: str) -> UserError:
    """call_reporting_exits()'s text of an error (the user's frames, if any, then its line) as a UserError."""
    *frames, line = text.splitlines()
    return UserError(line, frames="".join(f"{frame}\n" for frame in frames))


class RankTraceback(Exception):
    """The failing rank's traceback, shown as the cause of RankFailed."""


def call_reporting_exits(train, args) -> tuple[str, str]:
    """Call train(args): ("ok", ""), ("error", UserError's line) or ("stopped", why); an error raised in the user's
    files is ("error", their frames and its line), as run.sh shows it; other exceptions propagate.

    The project's train() turns a UserError into a line on stderr and sys.exit(1)
    (errors.explain_user_errors): that wrapper is skipped, so the message itself comes back.
    """
    target = train.__wrapped__ if getattr(train, "__code__", None) is _EXPLAINED_CODE else train
    try:
        target(args)
    except UserError as error:
        return "error", str(error)
    except SystemExit as exit_:
        if exit_.code in (None, 0):
            return "ok", ""
        if exit_.code == STOPPED_STATUS:
            return "stopped", "stopped by SIGTERM: launch() again with the same --output-dir continues the run"
        return "error", f"sys.exit({exit_.code!r})"
    except Exception as error:
        explained = errors.from_user_code(error)
        if explained is None:
            raise
        return "error", f"{explained.frames}{explained}"
    return "ok", ""


_EXPLAINED_CODE = errors.explain_user_errors(print).__code__


def close_package_logger() -> None:
    """Close the log files a run opened in this process: the next run (or rank) opens its own."""
    logger = logging.getLogger(__package__)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.propagate = True


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """os.environ with `variables` set, restored afterwards."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Ranks:
    """The processes of one launch(): start, watch, stop, and leave nothing behind."""

    def __init__(self, context, train, args, nproc: int):
        self.context, self.train, self.args, self.nproc = context, train, args, nproc
        self.processes: list = []
        self.readers: dict = {}  # connection -> rank
        self.reports: dict[int, tuple] = {}  # rank -> (status, message, traceback text, time)
        self.exit_codes: list[int | None] = []

    def run(self) -> None:
        try:
            self.start()
            failed = self.watch()
        except KeyboardInterrupt:
            self.stop_all()
            raise
        finally:
            self.kill_all()
        if failed is not None:
            _, message, remote_traceback, _ = self.reports.get(failed, (None, None, "", 0))
            if message is None:
                code = self.exit_codes[failed]
                message = f"rank {failed} ended with exit status {code} before it could say why" + (
                    f" (signal {signal.Signals(-code).name})" if code is not None and code < 0 else ""
                )
            error = RankFailed(message, failed)
            if remote_traceback:
                raise error from RankTraceback(f"rank {failed}:\n{remote_traceback}")
            raise error from None

    def start(self) -> None:
        port = free_port()
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // self.nproc))
        forked = self.context.get_start_method() == "fork"
        sys.stdout.flush()
        sys.stderr.flush()
        # The stop button held back until every rank is in self.processes: pressed between a fork and its
        # append, it would leave that rank running. It lands when unblocked, and run() stops them all.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.start_ranks(port, threads, forked)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def start_ranks(self, port: int, threads: str, forked: bool) -> None:
        from . import distributed

        for rank in range(self.nproc):
            variables = distributed.rank_environment(rank, rank, self.nproc, "127.0.0.1", port)
            variables["OMP_NUM_THREADS"] = threads
            reader, writer = self.context.Pipe(duplex=False)
            process = self.context.Process(
                target=_rank_main,
                args=(rank, self.train, self.args, writer, os.getpid(), forked),
                name=f"rank{rank}",
            )
            # A spawned rank reads its variables when it starts (paddle reads FLAGS_* on import): set them around start().
            with environment(variables), warnings.catch_warnings():
                # Python 3.12+ warns that the kernel has threads; the rank touches none of their state.
                warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
                process.start()
            writer.close()
            self.processes.append(process)
            self.readers[reader] = rank

    def watch(self) -> int | None:
        """Wait until every rank has ended, or one has failed; the failed rank, or None."""
        running = {process.sentinel: rank for rank, process in enumerate(self.processes)}
        while running:
            for ready in wait(list(running) + list(self.readers)):
                if ready in self.readers:
                    self.read_report(ready)
                elif ready in running:  # (not a reader drain() has just read)
                    rank = running.pop(ready)
                    self.processes[rank].join()
                    self.drain(rank)
            failed = self.first_failure(running)
            if failed is not None:
                return failed
        return None

    def read_report(self, reader) -> None:
        rank = self.readers.pop(reader)
        try:
            self.reports[rank] = reader.recv()
        except (EOFError, OSError):
            pass  # the rank died before it reported: its exit status says what is known
        reader.close()

    def drain(self, rank: int) -> None:
        for reader, owner in list(self.readers.items()):
            if owner == rank:
                if reader.poll():
                    self.read_report(reader)
                else:
                    self.readers.pop(reader)
                    reader.close()

    def first_failure(self, running: dict) -> int | None:
        """The rank whose failure came first: a report other than "ok", or an exit without one."""
        failures = [(report[3], rank) for rank, report in self.reports.items() if report[0] != "ok"]
        if failures:
            return min(failures)[1]
        ended = set(range(self.nproc)) - set(running.values())
        silent = [rank for rank in sorted(ended) if rank not in self.reports]
        return silent[0] if silent else None

    def stop_all(self) -> None:
        """The stop button: SIGTERM every rank (the project's ranks save a checkpoint), then wait for them."""
        alive = [process for process in self.processes if process.is_alive()]
        if not alive:
            return
        print(
            f"stopping {len(alive)} rank(s): they save a checkpoint first (press stop again to kill them)",
            file=sys.stderr,
        )
        try:
            self.signal_all(signal.SIGTERM, alive)
            self.join_all(alive, STOP_GRACE_S)
        except KeyboardInterrupt:
            pass  # pressed again: kill_all() follows

    def kill_all(self) -> None:
        """After the run, or a failure: nothing of it may outlive launch()."""
        alive = [process for process in self.processes if process.is_alive()]
        if alive:
            self.signal_all(signal.SIGTERM, alive)
            self.join_all(alive, FAILURE_GRACE_S)
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # the rank's own children, data-loader workers say
            if process.is_alive():  # not yet in its own group
                os.kill(process.pid, signal.SIGKILL)
            process.join()
            self.exit_codes.append(process.exitcode)
            process.close()
        for reader in self.readers:
            reader.close()
        self.readers.clear()

    @staticmethod
    def signal_all(signum: int, processes) -> None:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)

    @staticmethod
    def join_all(processes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))


def _rank_main(rank: int, train, args, writer, kernel_pid: int, forked: bool) -> None:
    """One rank: report how train(args) ended through `writer`, then exit without the kernel's exit handlers."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held back in the kernel while it started ranks
    os.setpgid(0, 0)  # the stop button signals the kernel's group: the kernel stops the ranks itself
    die_with_parent(kernel_pid)  # a kernel restart ends its ranks too
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a handler the kernel had (paddle's, an earlier run's)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Line by line to the file descriptors, not to a forked copy of the kernel's stream objects: a Jupyter
    # kernel forwards what reaches them to the cell. (io.open: IPython's open() refuses descriptors 0-2.)
    sys.stdout = io.open(1, "w", buffering=1, closefd=False)  # noqa: UP020
    sys.stderr = io.open(2, "w", buffering=1, closefd=False)  # noqa: UP020
    if forked:
        close_package_logger()  # a fresh process has no log files open; the kernel's belong to its own run
        _keep_kernel_loader()
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # the kernel's pool is sized for one process
    try:
        status, message = call_reporting_exits(train, args)
        remote_traceback = ""
    except KeyboardInterrupt:
        status, message, remote_traceback = "stopped", "interrupted", ""
    except BaseException as error:  # anything a rank raises is reported, then the rank ends
        status = "error"
        message = "".join(traceback.format_exception_only(type(error), error)).strip()
        remote_traceback = traceback.format_exc()
    with contextlib.suppress(OSError):
        writer.send((status, message, remote_traceback, time.monotonic()))
        writer.close()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit({"ok": 0, "stopped": STOPPED_STATUS}.get(status, 1))


def _keep_kernel_loader() -> None:
    """paddle keeps its last DataLoader iterator in a module global, and the next one replaces it.

    Deleting the kernel's iterator in a forked rank joins reader threads that exist in the
    kernel only, and hangs: the rank keeps it instead, and ends with os._exit(), not deleting it.
    """
    module = sys.modules.get("paddle.io.dataloader.dataloader_iter")
    if module is not None and getattr(module, "_loader", None) is not None:
        _kept_from_the_kernel.append(module._loader)
        module._loader = None
