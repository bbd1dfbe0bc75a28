"""One job per output folder: rank 0 holds a lock on OUTPUT_DIR/.job.lock for as long as the job runs.

The lock is the operating system's (flock): it goes when the process holding it ends, however it ends
(SIGKILL and a crash included), so a requeue or a restart after a crash is never refused. A job that is
still stopping (saving after scancel's SIGTERM when `sbatch` comes again) gets JOB_LOCK_WAIT seconds to end
(default 60); after that, the second job stops before it trains or writes anything, naming the host and
process that hold the folder. Inside an elastic job, a restarted rank 0 goes on where the lock's holder is its own
job: a lost machine's lock on a network file system lingers long after the machine is gone.
"""

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from . import roll_call
from .errors import UserError

LOCK_NAME = ".job.lock"
WAIT_VARIABLE, DEFAULT_WAIT_S = "JOB_LOCK_WAIT", 60.0


def hold(output_dir: str | Path, env) -> int | None:
    """On rank 0, take the folder's lock and keep it (the returned descriptor: release() it at the end);
    on every rank, raise the same UserError when another job holds it."""
    from . import distributed  # here: run.sh's platform step asks in_use() without importing the framework

    descriptor, refusal = _take(Path(output_dir)) if env.is_main else (None, None)
    refusal = distributed.share_from_main(refusal, "the output folder's lock")  # rank 0 may wait JOB_LOCK_WAIT
    if refusal:
        raise UserError(refusal, shown=env.local_rank == 0)
    return descriptor


def release(descriptor: int | None) -> None:
    if descriptor is not None:
        os.close(descriptor)


def in_use(output_dir: str | Path) -> str | None:
    """Why a job cannot start on `output_dir` (another holds it, and did not end within JOB_LOCK_WAIT), or None;
    takes no lock and writes nothing."""
    path = Path(output_dir) / LOCK_NAME
    if not path.exists():
        return None
    descriptor = os.open(path, os.O_RDONLY)
    try:
        refusal = _refusal_after_waiting(Path(output_dir), descriptor)
        if refusal is None:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        return refusal
    finally:
        os.close(descriptor)


def _take(folder: Path) -> tuple[int | None, str | None]:
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    refusal = _refusal_after_waiting(folder, descriptor)
    if refusal:
        os.close(descriptor)
        return None, refusal
    os.ftruncate(descriptor, 0)
    holder = f"host {socket.gethostname()}, process {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    if job := roll_call.job_id():
        holder += f", elastic job {job}"
    os.pwrite(descriptor, holder.encode(), 0)
    return descriptor, None


def _refusal_after_waiting(folder: Path, descriptor: int) -> str | None:
    """Lock `descriptor` (None; None too where this elastic job's own rank 0 of before a restart holds it), or,
    when another job still holds it after JOB_LOCK_WAIT seconds, why not."""
    deadline = time.monotonic() + float(os.environ.get(WAIT_VARIABLE) or DEFAULT_WAIT_S)
    told = False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            holder = os.pread(descriptor, 300, 0).decode(errors="replace").strip() or "a process"
        if (job := roll_call.job_id()) and holder.endswith(f", elastic job {job}"):
            return None  # this job's own rank 0 before a restart: gone, or being stopped by its launcher
        if time.monotonic() >= deadline:
            return (
                f"output folder {folder} is in use by another job ({holder}): wait for it to end or stop it, "
                "or give this job another --output-dir"
            )
        if not told:
            print(f"waiting for the job that holds {folder} to end ({holder})", file=sys.stderr, flush=True)
            told = True
        time.sleep(0.5)
