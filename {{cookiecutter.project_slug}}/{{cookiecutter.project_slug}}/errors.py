"""The one exception that means "the user must fix something", not a bug, and how it ends a process."""

import errno
import functools
import sys

# 128 + SIGTERM, as a process killed by it: a run stopped by SIGTERM did not finish, and schedulers
# (a Kubernetes Job, a SLURM requeue) must not count it as done.
STOPPED_STATUS = 143
# `run.sh --check` found problems, each already said in its own `error:` line: the launcher adds none.
CHECK_FAILED_STATUS = 3
# A collective timed out because a rank stopped answering (stalled_ranks.py): one `error:` line names the step and
# the rank; the launcher adds none (its own would name a rank that waited, not the one that stopped).
COLLECTIVE_TIMEOUT_STATUS = 4


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

    shown=False: the other ranks of a job where every rank meets the same error end quietly, rank 0 says it.
    """

    status = 1  # the process's exit status

    def __init__(self, message: str, shown: bool = True):
        super().__init__(message)
        self.shown = shown


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


def explain_user_errors(train):
    """Wrap train(args): a UserError ends this process with its one-line message and its status (1 mostly)."""

    @functools.wraps(train)  # keeps its name, so spawn can still pickle it by reference
    def train_or_explain(args) -> None:
        try:
            train(args)
        except UserError as error:
            if error.shown:
                # One write per line: the ranks print at the same moment, and must not interleave.
                sys.stderr.write(f"error: {error}\n")
                sys.stderr.flush()
            sys.exit(error.status)

    return train_or_explain
