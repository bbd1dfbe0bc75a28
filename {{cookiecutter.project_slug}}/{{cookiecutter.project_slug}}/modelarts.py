"""ModelArts: `python run.py --init_method tcp://HOST:PORT --rank R --world_size W`, one command per machine
with no launcher, becomes run.sh on that machine."""

import os
import sys
from collections.abc import Mapping

from .errors import PlatformError
from .platforms import NNODES_SOURCE, STARTED_BY_RUN_SH, split_endpoint
from .workspace import PROJECT_ROOT


def under_launcher(env: Mapping[str, str] = os.environ) -> bool:
    """True in a process that run.sh, torchrun, torch.distributed.launch, paddle's launcher or srun started as part of a job."""
    marks = (STARTED_BY_RUN_SH, "LOCAL_RANK", "PADDLE_LOCAL_RANK")
    return any(name in env for name in marks) or env.get("SLURM_NTASKS", "1") not in ("", "0", "1")


def start_this_machine(args, argv: list[str] | None = None) -> None:
    """ModelArts's `python run.py --init_method tcp://HOST:PORT --rank R --world_size W`, once per machine
    with no launcher: this command stands for machine R of W. It becomes `bash run.sh` with NNODES=W,
    NODE_RANK=R, MASTER_ADDR=HOST, MASTER_PORT=PORT (and the same other arguments), so that this machine's
    processes start as the project's launcher starts them: one per GPU, or one on a machine without a GPU.
    Does nothing without --init_method, or under a launcher (the flags are then ignored)."""
    if not args.init_method or under_launcher():
        return
    argv = sys.argv[1:] if argv is None else argv
    try:
        host, port = parse_init_method(args.init_method)
    except PlatformError as error:
        sys.exit(f"error: {error}")
    env = dict(os.environ, MASTER_ADDR=host, MASTER_PORT=str(port))
    if args.world_size is not None:  # else run.sh reads the machines from the platform (MA_NUM_HOSTS, ...)
        env.update(NNODES=str(args.world_size), NODE_RANK=str(args.rank or 0))
        env[NNODES_SOURCE] = "ModelArts (run.py --init_method --rank --world_size)"
    command = ["bash", str(PROJECT_ROOT / "run.sh"), *machine_argv(argv, args)]
    sys.stdout.flush()
    os.execvpe(command[0], command, env)


def parse_init_method(init_method: str) -> tuple[str, int]:
    scheme, _, endpoint = init_method.partition("://")
    if scheme != "tcp" or not endpoint:
        raise PlatformError(f"--init_method {init_method!r} is not tcp://HOST:PORT")
    return split_endpoint("--init_method", endpoint)


MACHINE_FLAGS = ("--init_method", "--rank", "--world_size")


def machine_argv(argv: list[str], args) -> list[str]:
    """run.py's arguments for run.sh: without the flags that named this machine, and with the paths made
    absolute (run.sh starts in the project folder, not where `python run.py` was started)."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in MACHINE_FLAGS:
            skip = True
        elif not item.startswith(tuple(flag + "=" for flag in MACHINE_FLAGS)):
            kept.append(item)
    kept += ["--output-dir", os.path.abspath(args.output_dir), "--data-dir", os.path.abspath(args.data_dir)]
    if args.dataset_zip:
        kept += ["--dataset-zip", os.path.abspath(args.dataset_zip)]
    if args.config:
        kept += ["--config", os.path.abspath(args.config)]
    if args.resume not in ("auto", "none"):
        kept += ["--resume", os.path.abspath(args.resume)]
    return kept
