"""The output folder: the one job that holds it, and the saves it keeps.

One job per output folder: rank 0 holds a lock on OUTPUT_DIR/.job.lock for as long as the job runs. The lock is the
operating system's (flock): it goes when the process holding it ends, however it ends (SIGKILL and a crash
included), so a requeue or a restart after a crash is never refused. A second job stops before it trains or writes
anything, naming the host and process that hold the folder; where the holder is stopping (saving after scancel's
SIGTERM when `sbatch` comes again: it says so in the lock's file), after JOB_LOCK_WAIT seconds (default 60) for it
to end. Inside an elastic job, a restarted rank 0 goes on where the lock's holder is its own job: a lost machine's
lock on a network file system lingers long after the machine is gone.

The saves that are kept: the folders of sharded saves, the links that name them (DIR/checkpoints/last and best),
and the K best epochs of --keep-best, listed in DIR/checkpoints/top.json. Every rank writes its part of a save into
a new folder, save-<time>; once the folder is complete, rank 0 points the links at it. A folder cannot be renamed
over another, but a link can be replaced in one step, so a crash during a save leaves the links on the previous
complete save. Both frameworks' checkpoint.py use these.
"""

import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import roll_call
from .errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = ".job.lock"
STOPPING = ", stopping"  # the holder's words in the lock's file once a SIGTERM came
_held: list[int] = []  # the lock this process holds (rank 0), for say_stopping()
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


def say_stopping() -> None:
    """This process, if it holds a folder, is stopping: a job started on the folder now waits for it to end."""
    if _held and not os.pread(_held[0], 300, 0).endswith(STOPPING.encode()):  # (a second SIGTERM: said already)
        os.pwrite(_held[0], STOPPING.encode(), os.fstat(_held[0]).st_size)


def release(descriptor: int | None) -> None:
    if descriptor is not None:
        _held.remove(descriptor)
        os.close(descriptor)


def in_use(output_dir: str | Path) -> str | None:
    """Why a job cannot start on `output_dir` (another holds it, and did not end within JOB_LOCK_WAIT), or None;
    takes no lock and writes nothing."""
    path = Path(output_dir) / LOCK_NAME
    if not os.path.exists(path):  # (nor a folder that cannot be read: the job says so as it takes the lock)
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
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:  # (a file of that name, a folder of another user's, a read-only disk)
        why = "it is a file" if os.path.isfile(folder) else error.strerror or error  # (isfile(): no PermissionError)
        return None, f"the output folder {folder} cannot be written ({why}): give --output-dir one you may write"
    refusal = _refusal_after_waiting(folder, descriptor)
    if refusal:
        os.close(descriptor)
        return None, refusal
    os.ftruncate(descriptor, 0)
    holder = f"host {socket.gethostname()}, process {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    if job := roll_call.job_id():
        holder += f", elastic job {job}"
    os.pwrite(descriptor, holder.encode(), 0)
    _held.append(descriptor)
    return descriptor, None


def _refusal_after_waiting(folder: Path, descriptor: int) -> str | None:
    """Lock `descriptor` (None; None too where this elastic job's own rank 0 of before a restart holds it), or,
    when another job holds it (one that is stopping: still after JOB_LOCK_WAIT seconds), why not."""
    deadline = time.monotonic() + float(os.environ.get(WAIT_VARIABLE) or DEFAULT_WAIT_S)
    told = False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            holder = os.pread(descriptor, 300, 0).decode(errors="replace").strip() or "a process"
        if (job := roll_call.job_id()) and holder.removesuffix(STOPPING).endswith(f", elastic job {job}"):
            return None  # this job's own rank 0 before a restart: gone, or being stopped by its launcher
        if not holder.endswith(STOPPING) or time.monotonic() >= deadline:  # (training: no use waiting)
            return (
                f"output folder {folder} is in use by another job ({holder}): wait for it to end or stop it, "
                "or give this job another --output-dir"
            )
        if not told:
            print(f"waiting for the job that holds {folder} to end ({holder})", file=sys.stderr, flush=True)
            told = True
        time.sleep(0.5)


LINKS = ("last", "best")
TOP = "top.json"


@dataclass
class Kept:
    """An epoch among the --keep-best best: its number and best metric's value, how many are kept, which way."""

    epoch: int
    value: float
    keep: int
    mode: str


def new_name() -> str:
    return f"save-{time.time_ns()}"


def publish(directory: Path, folder: Path, is_best: bool, kept: Kept | None = None) -> None:
    """Make the complete save `folder` the last one (and the best, and one of the top): the links switched to it,
    older saves gone."""
    if is_best:  # first: a crash between the two leaves last on the best's predecessor, not best behind
        point(directory / "best", folder)
    point(directory / "last", folder)
    if kept is not None:
        record_top(directory, kept, folder.name)
    remove_unlinked(directory)


def point(link: Path, folder: Path) -> None:
    """Point `link` at `folder` in one step: a new link, os.replace()d over the old one. A real folder in its
    place (a copy that followed the link: cp -L, rsync -L) becomes a save like the others."""
    if link.is_dir() and not link.is_symlink():
        link.rename(link.with_name(new_name()))
    temporary = link.with_name(f".{link.name}.tmp")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(folder.name)
    os.replace(temporary, link)


def carry_best(loaded: Path | None, directory: Path, is_main: bool, wait_for_save=lambda: None) -> None:
    """A run resumed from a save in another folder: rank 0 copies that folder's best (its best.* files, or the save
    its link best names) into `directory` where it has none, so that the best there is the whole run's. A copy that
    fails is said, and training goes on: the best stays where it was."""
    if not is_main or loaded is None or loaded.parent.resolve() == directory.resolve():
        return
    source = loaded.parent
    if any(directory.glob("best.*")) or (directory / "best").exists():
        return
    files, link = sorted(source.glob("best.*"), key=lambda file: file.suffix == loaded.suffix), source / "best"
    if not files and not link.is_dir():
        return
    wait_for_save()  # (a save written in the background removes the saves no link names: a copy being made too)
    try:
        if files:  # (a framework's save may be several files: the weights' last, as it writes them)
            directory.mkdir(parents=True, exist_ok=True)
            for file in files:
                shutil.copy2(file, directory / f".{file.name}.tmp")
                os.replace(directory / f".{file.name}.tmp", directory / file.name)  # (whole, or not there)
        else:
            copy = directory / new_name()
            shutil.copytree(link.resolve(), copy)
            point(directory / "best", copy)
    except OSError as error:
        log.warning("the resumed run's best save in %s could not be copied into %s (%s): it stays there", source,
                    directory, error)  # fmt: skip
        return
    log.info("the resumed run's best save in %s is copied into %s (later epochs may not beat it)", source, directory)


def remove_unlinked(directory: Path) -> None:
    """Saves no link points at and top.json does not list: older ones, and any a crash left incomplete."""
    kept = {(directory / link).resolve() for link in LINKS} | {
        (directory / entry["path"]).resolve() for entry in top(directory)
    }
    for folder in directory.glob("save-*"):
        if folder.resolve() not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def newest(file: Path, link: Path, last_written: str) -> Path | None:
    """The newer complete save of the two forms: the single `file`, or the folder `link` names (complete once
    its `last_written` file is there); None where there is neither."""
    saves = [path for path in (file, link / last_written) if path.is_file()]
    if not saves:
        return None
    path = max(saves, key=lambda save: save.stat().st_mtime)
    return link if path.parent == link else path


SUFFIXES = {".pt": "PyTorch", ".pdparams": "PaddlePaddle"}  # the file each framework's run.py saves
RESUME_CHOICES = "pass --resume auto, none, or an existing file (or sharded folder)"  # --resume's, not found


def check_checkpoint(checkpoint: Path, last_written: str, ours: str, missing: str | None = None) -> None:
    """What predict.py, export.py and load_for_inference() take, each other thing one line naming what to pass: a
    sharded save's folder (complete once its `last_written` file is there), or a file, not the other framework's
    (`ours`: this one's suffix). `missing`: what to pass instead of a checkpoint not found (--resume's choices)."""
    files = f"last{ours} or best{ours} from OUTPUT_DIR/checkpoints/"
    if checkpoint.is_dir() and not (checkpoint / last_written).is_file():
        raise UserError(
            f"{checkpoint} is a folder but not a save run.py wrote (no {last_written} in it): pass a {files}, or a "
            "sharded save's folder (OUTPUT_DIR/checkpoints/best)"
        )
    for suffix, framework in SUFFIXES.items():
        theirs = checkpoint.with_suffix(suffix)
        if suffix != ours and (checkpoint.suffix == suffix or not checkpoint.exists()) and theirs.is_file():
            raise UserError(
                f"{theirs} is a {framework} checkpoint and this project trains with {SUFFIXES[ours]}: use it in the "
                f"project that wrote it, or pass a {files}"
            )
    if not checkpoint.exists():
        raise UserError(f"checkpoint {checkpoint} not found: {missing or 'pass a ' + files}")


def top(directory: Path) -> list[dict]:
    """top.json's entries, best first: {"epoch": E, "value": V, "path": P}, P relative to `directory`."""
    path = directory / TOP
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def enters_top(directory: Path, kept: Kept) -> bool:
    """Whether the epoch is among the kept.keep best of top.json's and its own (ties: the earlier epoch)."""
    ranked = _ranked([*_others(directory, kept.epoch), {"epoch": kept.epoch, "value": kept.value}], kept.mode)
    return any(entry["epoch"] == kept.epoch for entry in ranked[: kept.keep])


def record_top(directory: Path, kept: Kept, path: str) -> None:
    """List the epoch's complete save `path` in top.json (rewritten whole, then switched in), and remove the saves
    of the entries it pushes out: a file form's files, or a folder no link names."""
    ranked = _ranked(
        [*_others(directory, kept.epoch), {"epoch": kept.epoch, "value": kept.value, "path": path}], kept.mode
    )
    temporary = directory / f".{TOP}.tmp"
    temporary.write_text(json.dumps(ranked[: kept.keep], indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, directory / TOP)
    linked = {(directory / link).resolve() for link in LINKS}
    for entry in ranked[kept.keep :]:
        save = directory / entry["path"]
        if not save.is_dir():
            for part in directory.glob(f"{save.stem}.*"):
                part.unlink()
        elif save.resolve() not in linked:
            shutil.rmtree(save, ignore_errors=True)


def _others(directory: Path, epoch: int) -> list[dict]:
    return [entry for entry in top(directory) if entry["epoch"] != epoch]  # (a redone epoch replaces its entry)


def _ranked(entries: list[dict], mode: str) -> list[dict]:
    sign = -1 if mode == "max" else 1
    return sorted(entries, key=lambda entry: (sign * entry["value"], entry["epoch"]))
