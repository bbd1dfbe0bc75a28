"""`bash run.sh --check`: the job's processes, started on every machine exactly as for training, check that it
can run, and train nothing.

Before the launcher starts, platforms.py has checked the master (its name resolves, its port answers, the
interface that reaches it) and run.sh that the port is free on machine 0. Here every process joins the job's
process group; each machine's first process says what it has (one `check` line each), all answers are
gathered, and every machine prints the same verdict: `ready: ...`, or one `error:` line per problem and the
exit status CHECK_FAILED_STATUS. Nothing is left in the output folder.

A machine's questions (its code, its data, its output folder, /dev/shm) are the functions below, each answering
for the paths it is given, so a test can hand it others.
"""

import contextlib
import hashlib
import importlib.util
import os
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path

from . import distributed, hardware
from .errors import CHECK_FAILED_STATUS, explain_user_errors
from .framework_probe import framework_build, gpu_count, timed_all_reduce
from .hardware import WAIT_S
from .workspace import ARCHIVE_SUFFIXES

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
# What each loader worker process may hold in /dev/shm at once: its prefetched batches (2 by default; an image
# batch of 64 x 3 x 224 x 224 in float32 is 38 MiB). A container's default /dev/shm is 64 MiB.
SHM_PER_WORKER = 128 * MiB
CLOCK_LIMIT_S = 5.0  # logs, checkpoints' times and certificates go wrong beyond a few seconds
ALL_REDUCE_MIB = 64
TOKEN_PREFIX = ".check-token-"


@explain_user_errors
def check(args) -> None:
    """What run.py runs in each process with --check."""
    env = distributed.setup(args.device, min(args.dist_timeout, WAIT_S))
    try:
        problems = check_job(args, env)
    finally:
        distributed.cleanup()
    if problems:
        sys.exit(CHECK_FAILED_STATUS)


def check_job(args, env) -> list[str]:
    """Every check of this process's part of the job; the problems found, the same list on every rank."""
    output = Path(args.output_dir).resolve()
    created = not output.exists()
    token = distributed.share_from_main(
        write_token(output) if env.is_main else None, "machine 0's token in the output folder"
    )
    report = machine_report(args, env, output, token) if env.local_rank == 0 else None
    if report is not None:
        for name, line in report["lines"]:
            say(f"check {name}: {line}")
    reports = [each for each in distributed.all_gather_object(report) if each is not None]  # one per machine
    seconds, total = timed_all_reduce(ALL_REDUCE_MIB * MiB // 4, env.device) if env.world_size > 1 else (0.0, 1.0)
    timings = distributed.all_gather_object((seconds, total, time.time()))  # the clocks, read at the same moment
    problems = machine_problems(reports) + job_problems(timings, env.world_size, len(reports))
    if env.local_rank == 0:
        say(f"check all-reduce: {all_reduce_line(timings, env)}")
        say(f"check clocks: {clocks_line(timings, env.world_size // len(reports))}")
        for problem in problems:
            say(f"error: {problem}", sys.stderr)
        if not problems:
            say(
                f"ready: {len(reports)} machine(s) x {env.local_world_size} process(es), {reports[0]['build']}; "
                "start the job with the same command without --check"
            )
    distributed.barrier("every machine's check")  # the others have read the token: machine 0 removes it
    if env.local_rank == 0:
        leave_as_found(output, token if env.is_main else None, created)
    return problems


def data_present(data_dir: str | None, archive: str | None) -> str | None:
    """What of the data is here, in words; None where neither the folder nor an archive of it is."""
    if archive:
        path = Path(archive)
        return f"the archive {path} ({path.stat().st_size / MiB:.1f} MiB)" if path.is_file() else None
    folder = Path(data_dir)
    if folder.is_dir() and any(folder.iterdir()):
        return f"the folder {folder}"
    # The project's sample: data/<SAMPLE>.zip beside its folder, extracted at the start.
    beside = [folder.with_name(folder.name + suffix) for suffix in ARCHIVE_SUFFIXES]
    return next((f"the archive {path}" for path in beside if path.is_file()), None)


def code_hash(root: Path, package: str) -> tuple[str, int]:
    """A short hash of the project's code (run.sh, requirements.txt, the *.py files), and how many files it covers."""
    files = [root / "run.sh", root / "requirements.txt", *root.glob("*.py"), *(root / package).rglob("*.py")]
    digest = hashlib.sha256()
    present = sorted(path for path in files if path.is_file())
    for path in present:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12], len(present)


def write_probe(folder: Path) -> str | None:
    """Why `folder` cannot be written (created where missing); None where a file can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".check-{socket.gethostname()}-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        return None
    except OSError as error:
        return error.strerror or str(error)


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def checkpoint_bytes(checkpoints: Path) -> int:
    """The size of the last save (last.pt, last.pdparams and last.pdopt, or a sharded save's folder); 0 before one."""
    saved = list(checkpoints.glob("last*")) if checkpoints.is_dir() else []
    files = [path for entry in saved for path in ([entry] if entry.is_file() else entry.rglob("*")) if path.is_file()]
    return sum(path.stat().st_size for path in files)


def shm_free(path: Path = Path("/dev/shm")) -> int | None:
    """Free bytes of the shared memory that loader workers hand batches through; None where there is none."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def say(line: str, stream=sys.stdout) -> None:
    stream.write(line + "\n")
    stream.flush()


def write_token(output: Path) -> str | None:
    """A file only machine 0 writes in its output folder; the others look for it in theirs."""
    if write_probe(output):
        return None  # machine 0's own report says why
    token = TOKEN_PREFIX + secrets.token_hex(8)
    (output / token).write_text(socket.gethostname())
    return token


def leave_as_found(output: Path, token: str | None, created: bool) -> None:
    """The output folder as it was: without the token, and gone where the check made it (and it is empty)."""
    with contextlib.suppress(OSError):
        if token:
            (output / token).unlink()
        if created:
            output.rmdir()


def machine_report(args, env, output: Path, token: str | None) -> dict:
    """What this machine has, for the comparisons, and its `check` lines."""
    gpus = gpu_count() if env.on_gpu else 0
    build = framework_build()
    where = f"{gpus} GPU(s)" if env.on_gpu else "the CPU"
    code, files = code_hash(PROJECT_ROOT, __package__)
    data = "synthetic" if args.synthetic else data_present(args.data_dir, args.dataset_zip)
    unwritable = write_probe(output)
    free = free_bytes(output) if not unwritable else 0
    need = checkpoint_bytes(output / "checkpoints")
    workers = args.workers
    if workers is None:  # the loaders' own default
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    shm = shm_free()
    room = f"{free / 2**30:.1f} GiB free" + (f", the last checkpoint {need / MiB:.0f} MiB" if need else "")
    # --tracking's value is its package's name; rank 0 alone tracks, on machine 0.
    tracker = None if args.tracking == "none" or not env.is_main else args.tracking
    untracked = tracker is not None and importlib.util.find_spec(tracker) is None
    return {
        "host": socket.gethostname(),
        "build": build,
        "processes": env.local_world_size,
        "code": code,
        "data": data,
        "data_path": args.dataset_zip or args.data_dir,
        "output": str(output),
        "unwritable": unwritable,
        "sees_token": token is not None and (output / token).is_file(),
        "free": free,
        "need": need,
        "workers": workers * env.local_world_size,
        "shm": shm,
        "untracked": tracker if untracked else None,
        "lines": [
            ("framework", f"{build}; {env.local_world_size} process(es) on {where}"),
            ("code", f"{code} ({files} files of the project)"),
            ("data", "synthetic, nothing to read" if args.synthetic else data or "missing"),
            ("output", f"{output}: " + (f"cannot be written ({unwritable})" if unwritable else room)),
            ("shm", shm_line(shm, workers * env.local_world_size)),
            *([("tracking", f"{tracker}: " + ("not installed" if untracked else "installed"))] if tracker else []),
        ],
    }


def shm_line(free: int | None, workers: int) -> str:
    have = "no /dev/shm" if free is None else f"/dev/shm {free / MiB:.0f} MiB free"
    return f"{have}; {workers} loader worker(s) on this machine" + (
        f" need about {workers * SHM_PER_WORKER / MiB:.0f} MiB" if workers else ""
    )


def machine_problems(reports: list[dict]) -> list[str]:
    """The problems of each machine, and where a machine differs from machine 0."""
    first, problems = reports[0], []
    for index, report in enumerate(reports):
        machine = f"machine {index} ({report['host']})"
        if report["build"] != first["build"]:
            problems.append(
                f"{machine} has {report['build']}, machine 0 {first['build']}: install the same on every machine"
            )
        if report["processes"] != first["processes"]:
            problems.append(
                f"{machine} starts {report['processes']} process(es), machine 0 {first['processes']}: give every "
                "machine the same NPROC_PER_NODE"
            )
        if report["code"] != first["code"]:
            problems.append(
                f"{machine} runs other code than machine 0 (hash {report['code']}, not {first['code']}): copy the "
                "same project to every machine, or start it from a shared folder"
            )
        if report["data"] is None:
            problems.append(
                f"{machine} has no data at {report['data_path']} (neither the folder nor its archive): copy it "
                "there, or give --data-dir / --dataset-zip a path every machine sees"
            )
        problems += output_problems(report, machine, first)
        if report["untracked"]:
            problems.append(
                f"{machine}: --tracking {report['untracked']} needs its package: pip install {report['untracked']}, "
                "or pass --no-tracking"
            )
        if report["workers"] and (report["shm"] or 0) < report["workers"] * SHM_PER_WORKER:
            problems.append(
                f"{machine}: {shm_line(report['shm'], report['workers'])}: make /dev/shm larger (docker run "
                "--shm-size=8g; Kubernetes: an emptyDir with medium Memory at /dev/shm), or lower --workers"
            )
    return problems


def output_problems(report: dict, machine: str, first: dict) -> list[str]:
    if report["unwritable"]:
        return [
            f"{machine} cannot write the output folder {report['output']} ({report['unwritable']}): give "
            "--output-dir a folder every machine may write"
        ]
    if first["unwritable"]:
        return []  # whether the folder is shared is not known: machine 0 could not leave its token there
    if not report["sees_token"]:
        return [
            f"{machine}'s output folder {report['output']} is not machine 0's {first['output']} (machine 0's file "
            "is not in it): give --output-dir a folder on a file system every machine mounts at the same path"
        ]
    if report["free"] < report["need"]:
        return [
            f"{machine}: the output folder has {report['free'] / MiB:.0f} MiB free, the next checkpoint needs about "
            f"{report['need'] / MiB:.0f} MiB: free some space there, or give --output-dir another folder"
        ]
    return []


def job_problems(timings: list[tuple[float, float, float]], world_size: int, machines: int) -> list[str]:
    problems = []
    sums = {total for _, total, _ in timings}
    if sums != {float(world_size)}:
        problems.append(
            f"an all-reduce of ones over {world_size} ranks summed to {sorted(sums)}, not {world_size}: the "
            "collective backend is broken on some machine (NCCL_DEBUG=INFO says more)"
        )
    per_machine = world_size // machines
    for index, offset in enumerate(clock_offsets(timings, per_machine)):
        if abs(offset) > CLOCK_LIMIT_S:
            problems.append(
                f"machine {index}'s clock is {offset:+.1f} s off machine 0's: synchronise the clocks (chrony or "
                "systemd-timesyncd, with the same NTP server)"
            )
    return problems


def clock_offsets(timings: list[tuple[float, float, float]], per_machine: int) -> list[float]:
    """Each machine's clock minus machine 0's, read by their first processes right after the same all-reduce."""
    firsts = [clock for _, _, clock in timings[::per_machine]]
    return [clock - firsts[0] for clock in firsts]


def clocks_line(timings: list[tuple[float, float, float]], per_machine: int) -> str:
    worst = max(clock_offsets(timings, per_machine), key=abs)
    return f"every machine within {abs(worst):.2f} s of machine 0 (the limit: {CLOCK_LIMIT_S:g} s)"


def all_reduce_line(timings: list[tuple[float, float, float]], env) -> str:
    """The all-reduce's time (its slowest rank's) and bus bandwidth, as nccl-tests measure it: the bytes each rank
    sends and receives, 2 (n - 1) / n of the tensor."""
    seconds = max(seconds for seconds, _, _ in timings)
    moved = ALL_REDUCE_MIB * MiB * 2 * (env.world_size - 1) / max(env.world_size, 1)
    backend = "NCCL" if env.on_gpu else "gloo"
    speed = f"{moved / seconds / 1e9:.2f} GB/s bus bandwidth" if moved else "one process: nothing sent"
    return f"{ALL_REDUCE_MIB} MiB over {env.world_size} rank(s) on {backend} in {seconds:.3f} s, {speed}"
