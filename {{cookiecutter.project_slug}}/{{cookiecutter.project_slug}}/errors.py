"""The one exception that means "the user must fix something", not a bug, and how it ends a process: in one
`error:` line, said once on each machine however many of its ranks meet it; where the user's own code raised, the
frames of the user's files above it."""

import contextlib
import errno
import functools
import hashlib
import io
import logging
import math
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

# 128 + SIGTERM, as a process killed by it: a run stopped by SIGTERM did not finish, and schedulers
# (a Kubernetes Job, a SLURM requeue) must not count it as done.
STOPPED_STATUS = 143
# `run.sh --check` found problems, each already said in its own `error:` line: the launcher adds none.
CHECK_FAILED_STATUS = 3
# A collective timed out because a rank stopped answering (roll_call.py): one `error:` line names the step and
# the rank; the launcher adds none (its own would name a rank that waited, not the one that stopped).
COLLECTIVE_TIMEOUT_STATUS = 4
# 128 + SIGINT: Ctrl-C, which a terminal sends to every process of the job.
INTERRUPTED_STATUS = 130


def more_processes_than_gpus(processes: int, gpus: int) -> str:
    """The line for a machine that would run more processes than it has GPUs, each needing its own."""
    return (
        f"{processes} processes on this machine, but it has {gpus} visible GPU{'s' if gpus != 1 else ''}, and each "
        f"process needs its own: start at most {gpus} (NPROC_PER_NODE={gpus}), make more GPUs visible "
        "(CUDA_VISIBLE_DEVICES), or train on the CPU with --device cpu"
    )


def gpu_shortage(processes: int, gpus: int, device: str) -> str | None:
    """The line for `processes` on a machine with `gpus` GPUs, where --device auto or gpu gives each process a GPU
    of its own and there are too few (none at all: they train on the CPU); None where they fit."""
    return more_processes_than_gpus(processes, gpus) if device != "cpu" and 0 < gpus < processes else None


def unusable_gpus(framework: str, cuda: str | None, cpu_build_fix: str) -> str:
    """Why `framework` (its name and version), built for `cuda` (None: a CPU build), cannot use the GPUs the NVIDIA
    driver shows."""
    if cuda is None:
        return f"this {framework} is a CPU build: {cpu_build_fix}"
    return (
        f"{framework}, built for CUDA {cuda}, cannot use the GPUs the NVIDIA driver shows (a driver older than that "
        "CUDA needs? nvidia-smi shows the newest CUDA the driver runs)"
    )


def os_words(error: OSError) -> str:
    """An OSError in words: why, and the path it names where it names one (a full disk names none)."""
    return f"{error.strerror or error}: {error.filename}" if error.filename else str(error.strerror or error)


def no_space_line(directory: Path, needed: int) -> str:
    """Why a save of about `needed` bytes failed on a full disk, and what to do."""
    free = shutil.disk_usage(directory).free
    return (
        f"no space left in {directory} for the checkpoint: it needs about {needed / 2**20:.1f} MB, "
        f"{free / 2**20:.1f} MB are free; the last complete checkpoint there is kept: free some space (or move "
        "the output folder to a larger disk) and run the same command to resume from it"
    )


def bytes_of(contents) -> int:
    """About the bytes a checkpoint of `contents` takes: those of its tensors and arrays (either framework's)."""
    if isinstance(contents, dict):
        contents = list(contents.values())
    if isinstance(contents, (list, tuple)):
        return sum(bytes_of(item) for item in contents)
    if hasattr(contents, "element_size"):  # a torch or paddle tensor
        return contents.element_size() * math.prod(contents.shape)
    return getattr(contents, "nbytes", 0)  # a numpy array


def disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it arose from, is a full disk (or a used-up quota).

    torch.save() reports it as its own RuntimeError, raised while handling the OSError of the write.
    """
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        # torch.distributed.checkpoint's error holds each failed rank's (error, traceback)
        if any(disk_full(failure[0]) for failure in getattr(error, "failures", {}).values()):
            return True
        error = error.__cause__ or error.__context__
    return False


class PlatformError(Exception):
    """The environment describes a job that cannot be right; one line says what to change."""


class UserError(Exception):
    """Bad input or environment; the job stops with this message as one line.

    shown=False: the other ranks of a job where every rank meets the same error end quietly; each machine's first
    rank (local rank 0) says it.
    frames: where the user's own code raised, its frames (user_frames()), said above the line.
    """

    status = 1  # the process's exit status

    def __init__(self, message: str, shown: bool = True, frames: str = ""):
        super().__init__(message)
        self.shown, self.frames = shown, frames

    def _render_traceback_(self) -> list[str]:
        """What a notebook shows of it (IPython asks for this): the lines run.sh prints, not the kernel's frames."""
        return f"{self.frames}error: {self}".splitlines()


# The files a user owns; the frames of an error that passed through them are shown, no others.
USER_FILES = ("model.py", "data.py", "task.py")
USER_PATHS = {Path(__file__).resolve().parent / name for name in USER_FILES}
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def user_frames(error: BaseException) -> tuple[str, str | None]:
    """(the frames of `error`'s traceback in the user's files, as Python prints them; the innermost of them as
    "function() in file.py", the function that went wrong), ("", None) where none of them is on the way. With
    FULL_TRACEBACK=1 in the environment, the frames are Python's whole traceback."""
    walked = [(frame, line) for frame, line in traceback.walk_tb(error.__traceback__)]
    mine = [(frame, line) for frame, line in walked if _is_user_file(frame.f_code.co_filename)]
    if not mine:
        return "", None
    # The innermost function that is not a comprehension's frame (Python before 3.12 gives them one).
    functions = [frame.f_code for frame, _ in mine if frame.f_code.co_name not in COMPREHENSIONS]
    code = (functions or [mine[-1][0].f_code])[-1]
    name = f"{getattr(code, 'co_qualname', code.co_name)}() in {Path(code.co_filename).name}"
    if code.co_name == "<module>":  # the file's top level, run when it is imported
        name = f"importing {Path(code.co_filename).name}"
    if os.environ.get("FULL_TRACEBACK"):  # FULL_TRACEBACK=1: every frame, the framework's too, as Python shows them
        return "".join(traceback.format_exception(type(error), error, error.__traceback__)), name
    return "".join(traceback.StackSummary.extract(iter(mine)).format()), name


def _is_user_file(filename: str) -> bool:
    return Path(filename).resolve() in USER_PATHS


def from_user_code(error: BaseException) -> UserError | None:
    """`error`, raised in the user's files or in what they called, as one line naming the function that went wrong,
    with the user's frames above it; None where it did not pass through them (a bug to show whole)."""
    if isinstance(error, SyntaxError) and error.filename and _is_user_file(error.filename):
        where = "".join(traceback.format_exception_only(type(error), error)[:-1])  # the line, marked
        return UserError(f"importing {Path(error.filename).name} raised {first_line(error)}", frames=where)
    frames, function = user_frames(error)
    if function is None:
        return None
    return UserError(f"{function} raised {first_line(error)}", frames=frames)


def first_line(error: BaseException) -> str:
    """`KeyError: 'label'`: the error's type and the first line of its message."""
    message = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


# Set by the launchers (said_once_per_machine()): a folder of this machine's job where each error said is kept.
SAID = "ERRORS_SAID_IN"
LOCAL_RANKS = ("LOCAL_RANK", "PADDLE_LOCAL_RANK", "PADDLE_RANK_IN_NODE")  # torch's launchers', paddle's


def say(error: UserError) -> None:
    """Write `error` (its frames, then its `error:` line) to stderr, unless another process of this machine's job has
    said the same. The claim's file holds this process's local rank and the text: paddle's launcher shows only local
    rank 0's console, and says the others' itself."""
    text = f"{error.frames}error: {error}\n"
    folder = os.environ.get(SAID)
    if folder:
        local_rank = next((os.environ[name] for name in LOCAL_RANKS if name in os.environ), "0")
        # The same mistake on every rank, whatever the sizes of each one's batch (a text batch is padded to its own
        # longest): the claim is named after the text without them.
        same = re.sub(r"\[[\d, ]*\]", "[]", text)
        claim = Path(folder, hashlib.sha256(same.encode()).hexdigest()[:20])
        try:
            with open(claim, "x", encoding="utf-8") as file:
                file.write(f"{local_rank}\n{text}")
        except FileExistsError:
            return  # another rank of this machine said it
        except OSError:
            pass  # the folder is gone (its launcher ended): say it anyway
    # One write: the ranks write at the same moment, and must not interleave.
    sys.stderr.write(text)
    sys.stderr.flush()


@contextlib.contextmanager
def ended_quietly_by_ctrl_c():
    """Around a script's imports, which load the framework for seconds: Ctrl-C meanwhile (a terminal sends it to
    every process) ends the process with INTERRUPTED_STATUS and no traceback. Paddle's core turns the interrupt
    into an ImportError, after a line of its own: what the imports write to stderr is held until they end."""
    heard, held = [], io.StringIO()

    def interrupt(signum, frame):
        heard.append(signum)
        raise KeyboardInterrupt

    default = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (not where it is ignored)
    if default:
        signal.signal(signal.SIGINT, interrupt)
    try:
        with contextlib.redirect_stderr(held):
            yield
    except (KeyboardInterrupt, ImportError):
        if not heard:
            raise
        sys.exit(INTERRUPTED_STATUS)
    finally:
        if default:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if not heard:  # (less paddle's warning whenever OMP_NUM_THREADS is over 1, for builds on OpenBlas; paddle's
            # wheels are built on MKL, and run.sh gives each process its share of the cores on purpose)
            warned = ("WARNING: OMP_NUM_THREADS set to ", "PLEASE USE OMP_NUM_THREADS WISELY.")
            sys.stderr.write("".join(line for line in held.getvalue().splitlines(True) if not line.startswith(warned)))
        # Log handlers made meanwhile (torch's, under TORCH_LOGS) write to stderr from now on, not to what was held.
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        for handler in (handler for logger in loggers for handler in getattr(logger, "handlers", ())):
            if getattr(handler, "stream", None) is held:
                handler.setStream(sys.stderr)


@contextlib.contextmanager
def said_once_per_machine():
    """For a launcher: its ranks say each error once (say()); yields the folder of what they said (said()). Ctrl-C
    reaches the ranks too: the launcher ends when its children have, without a traceback of its own."""
    folder = tempfile.mkdtemp(prefix="errors-said-")
    os.environ[SAID] = folder
    try:
        yield Path(folder)
    except KeyboardInterrupt:
        for child in multiprocessing.active_children():  # (spawn's ranks; each says it once, as train_or_explain())
            child.join(timeout=10)
            if child.is_alive():  # held in a collective by a rank that left: it would wait --dist-timeout
                child.kill()
        sys.exit(INTERRUPTED_STATUS)
    finally:
        os.environ.pop(SAID, None)
        shutil.rmtree(folder, ignore_errors=True)


def said(folder: Path) -> dict[str, int]:
    """The errors said in `folder` (said_once_per_machine()'s), each with the local rank that said it."""
    claims = {}
    for claim in sorted(folder.glob("*"), key=lambda path: path.stat().st_mtime_ns):
        with contextlib.suppress(OSError, ValueError):
            rank, _, text = claim.read_text(encoding="utf-8").partition("\n")
            claims[text] = int(rank)
    return claims


def _by_ctrl_c(error: BaseException | None) -> bool:
    """Ctrl-C, or an error that a framework raised as Ctrl-C unwound it (torch.save()'s writer, cut short, fails in
    its own cleanup)."""
    while error is not None and not isinstance(error, KeyboardInterrupt):
        error = error.__context__
    return error is not None


def out_of_memory_is_a_user_error(out_of_memory: type[BaseException]):
    """Decorate a training or evaluation pass: the framework's `out_of_memory` error becomes one line that
    names the flags which lower the memory a step needs."""

    def decorate(function):
        @functools.wraps(function)
        def explained(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except out_of_memory as error:
                what = next((line.strip() for line in str(error).splitlines() if line.strip()), "out of memory")
                raise UserError(
                    f"out of memory ({what[:160]}): lower --batch-size (per process), and raise --grad-accum to keep "
                    "the global batch, or give --global-batch-size G and a smaller --batch-size (the accumulation "
                    "steps follow)"
                ) from None

        return explained

    return decorate


def _into_log_files(error: UserError) -> None:
    """The error line in this process's log file too (train.log, logs/rankN.log): a job's console is often gone."""
    for handler in logging.getLogger(__package__).handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(logging.makeLogRecord({"msg": f"error: {error}", "levelno": logging.ERROR}))


def explain_user_errors(train):
    """Wrap train(args): a UserError ends this process with its one-line message and its status (1 mostly); so
    does an error raised in the user's files (from_user_code()), under their frames."""

    @functools.wraps(train)  # keeps its name, so spawn can still pickle it by reference
    def train_or_explain(args) -> None:
        try:
            train(args)
        except (Exception, KeyboardInterrupt) as error:
            if _by_ctrl_c(error):  # one line for the machine, not a traceback from every process
                error = UserError(
                    "interrupted (Ctrl-C): the checkpoints saved so far are kept; the same command continues"
                )
                error.status = INTERRUPTED_STATUS
            explained = error if isinstance(error, UserError) else from_user_code(error)
            if explained is None:
                raise
            if explained.shown:
                say(explained)
            _into_log_files(explained)
            sys.exit(explained.status)

    return train_or_explain
