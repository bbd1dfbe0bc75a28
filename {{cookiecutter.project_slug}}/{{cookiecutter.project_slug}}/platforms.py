"""Where the job runs, read from what the platform put in the environment.

run.sh asks this module before it starts anything: `python -m <package>.platforms [run.py's ARGS]` prints
shell assignments (machines, this machine's index, processes per machine, the master, the output folder)
that run.sh evaluates, or one `error:` line, exit status 1. The platform is the first source that matches:

    SLURM         inside an srun step, one task per machine: SLURM_NNODES, SLURM_NODEID, the first host
    Kubeflow      PyTorchJob / TrainJob: PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT;
                  older operators (one process per pod): WORLD_SIZE machines, RANK, MASTER_ADDR/PORT
    PaddleJob     PADDLE_MASTER, PADDLE_NNODES; PaddleCloud / AI Studio: the PADDLE_TRAINER_ENDPOINTS family
    ModelArts     MA_NUM_HOSTS, VC_TASK_INDEX, VC_WORKER_HOSTS (the first is the master), MA_NUM_GPUS
    none          this machine alone

A user who sets NNODES describes the job alone (no detection); NODE_RANK, MASTER_ADDR, MASTER_PORT and
NPROC_PER_NODE set by the user override just their own value. The standard library only: the framework is
imported only to count the GPUs of a machine that has an NVIDIA driver.
"""

import contextlib
import io
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from . import cli, hardware, output_folder, roll_call, workspace
from .errors import INTERRUPTED_STATUS, PlatformError, gpu_shortage
from .settings import FRAMEWORK, LAUNCHER, NODES

DEFAULT_PORT = 29500
DEFAULT_JOIN_TIMEOUT_S = 900.0
# Paddle's launcher can let the master number the machines; torchrun, torch.distributed.launch and spawn cannot.
MASTER_NUMBERS_MACHINES = FRAMEWORK == "paddle" and LAUNCHER in ("launch", "fleetrun")
# Set by run.sh for what it starts: the machine's layout is decided, ModelArts's --init_method has no more to say.
STARTED_BY_RUN_SH = "STARTED_BY_RUN_SH"
# Set by start_this_machine() for run.sh: where its NNODES came from, for the line run.sh prints.
NNODES_SOURCE = "NNODES_SOURCE"


class Layout(NamedTuple):
    platform: str  # what was found, in words
    nnodes: int
    node_rank: int | None  # None: Paddle's launcher lets the master number the machines
    master_addr: str
    master_port: int | None  # None: one machine, a free port picked at start
    nproc: int | None = None  # processes per machine, where the platform says
    min_nnodes: int | None = None  # an elastic job (NNODES=MIN:MAX): its fewest machines; nnodes is the most


# ----------------------------------------------------------------------------- detection


def detect(env: Mapping[str, str]) -> Layout:
    """The job as the environment describes it, before the user's own variables (see decide())."""
    if "NNODES" in env:
        source = env.get(NNODES_SOURCE, "NNODES set by you")
        return ranged(Layout(source, 0, 0, "127.0.0.1", DEFAULT_PORT), "NNODES", env["NNODES"])
    for source in (from_slurm, from_kubeflow, from_paddle, from_modelarts):
        layout = source(env)
        if layout is not None:
            return layout
    return Layout("none (this machine alone)", 1, 0, "127.0.0.1", DEFAULT_PORT)


def from_slurm(env: Mapping[str, str]) -> Layout | None:
    if "SLURM_JOB_ID" not in env:
        return None
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", ""))
    # The batch shell and the "extern" step carry ids near 2**32, not the small numbers of srun steps.
    in_step = step.isdigit() and int(step) < 0xFFFFFFF0
    if not in_step:
        machines = number("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
        if machines > 1:
            raise PlatformError(
                f"this is the batch shell of a {machines}-machine SLURM allocation, outside srun: start run.sh on "
                "every machine with `srun --ntasks-per-node=1 bash run.sh`, or submit slurm/train.sbatch"
            )
        return None  # a one-machine allocation's shell: this machine alone
    nnodes = number("SLURM_NNODES", env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "1")), minimum=1)
    tasks = number("SLURM_NTASKS", env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", str(nnodes))))
    if tasks != nnodes:
        raise PlatformError(
            f"run.sh runs as one task per machine and starts that machine's processes itself, but this srun step "
            f"has {tasks} tasks on {nnodes} machine(s): use `srun --ntasks-per-node=1 bash run.sh` (as "
            "slurm/train.sbatch does), or `srun python run.py` for one task per process"
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    job_id = env["SLURM_JOB_ID"]
    # The same port on every machine of the job, and another for the next job on the same head node.
    port = 20000 + int(job_id) % 10000 if job_id.isdigit() else DEFAULT_PORT
    rank = number("SLURM_NODEID", env.get("SLURM_NODEID", "0"))
    return Layout("SLURM", nnodes, rank, first_slurm_host(nodelist) or "127.0.0.1", port)


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM host list: "gpu[07-09,12],cpu1" -> "gpu07"; "r[1-2]-n[3-4]" -> "r1-n3"."""
    first, depth = [], 0
    for char in nodelist:
        if char == "," and depth == 0:
            break
        depth += (char == "[") - (char == "]")
        first.append(char)
    return re.sub(r"\[([^\]]*)\]", lambda group: re.split(r"[-,]", group.group(1))[0], "".join(first))


def from_kubeflow(env: Mapping[str, str]) -> Layout | None:
    if "PET_NNODES" in env:  # PyTorchJob (training-operator v1.7+), TrainJob (Trainer v2)
        rank = env.get("PET_NODE_RANK", env.get("RANK"))
        nproc = env.get("PET_NPROC_PER_NODE", "")
        layout = Layout(
            "Kubeflow PyTorchJob/TrainJob",
            0,
            None if rank is None else number("PET_NODE_RANK", rank),
            env.get("PET_MASTER_ADDR", env.get("MASTER_ADDR", "127.0.0.1")),
            number("PET_MASTER_PORT", env.get("PET_MASTER_PORT", env.get("MASTER_PORT", str(DEFAULT_PORT)))),
            # "auto", "gpu", "cpu": torchrun's own words for "count them"; run.sh counts the GPUs.
            number("PET_NPROC_PER_NODE", nproc, minimum=1) if nproc.isdigit() else None,
        )
        return ranged(layout, "PET_NNODES", env["PET_NNODES"])  # an elasticPolicy's PET_NNODES is MIN:MAX
    if {"WORLD_SIZE", "RANK", "MASTER_ADDR"} <= env.keys() and "LOCAL_RANK" not in env:
        # Older operators: one process per pod, so WORLD_SIZE counts pods and RANK is the pod's index.
        return Layout(
            "Kubeflow PyTorchJob (WORLD_SIZE pods)",
            number("WORLD_SIZE", env["WORLD_SIZE"], minimum=1),
            number("RANK", env["RANK"]),
            env["MASTER_ADDR"],
            number("MASTER_PORT", env.get("MASTER_PORT", str(DEFAULT_PORT))),
        )
    return None


def from_paddle(env: Mapping[str, str]) -> Layout | None:
    if "PADDLE_MASTER" in env or "PADDLE_NNODES" in env:  # Kubeflow PaddleJob, AI Studio
        master = env.get("PADDLE_MASTER", "")
        if master.startswith("etcd://"):  # an elastic PaddleJob: the machines meet in etcd (roll_call.etcd_endpoint)
            master = ""
        if "://" in master:
            raise PlatformError(
                f"PADDLE_MASTER={master}: run.sh needs a HOST:PORT master, not a {master.split(':')[0]} one"
            )
        host, port = split_endpoint("PADDLE_MASTER", master) if master else ("", DEFAULT_PORT)
        name = "Kubeflow PaddleJob" if "PADDLE_JOB_ID" in env else "PaddlePaddle platform (PADDLE_MASTER)"
        layout = Layout(name, 0, paddlejob_machine_index(env), host, port)
        return ranged(layout, "PADDLE_NNODES", env.get("PADDLE_NNODES", "1"))
    hosts = trainer_hosts(env)
    if not hosts:
        return None
    endpoints = [item.strip() for item in env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if item.strip()]
    port = split_endpoint("PADDLE_TRAINER_ENDPOINTS", endpoints[0])[1] if endpoints else DEFAULT_PORT
    return Layout("PaddlePaddle platform (PADDLE_TRAINER_ENDPOINTS)", len(hosts), trainer_index(env), hosts[0], port)


def trainer_hosts(env: Mapping[str, str]) -> list[str]:
    """PaddleCloud / AI Studio: the machines are the distinct hosts of the trainers' list, the first the master."""
    family = env.get("PADDLE_TRAINERS") or env.get("PADDLE_TRAINER_ENDPOINTS") or ""
    return list(dict.fromkeys(item.strip().rsplit(":", 1)[0] for item in family.split(",") if item.strip()))


def trainer_index(env: Mapping[str, str]) -> int | None:
    """This machine's among trainer_hosts(): its PADDLE_CURRENT_ENDPOINT's (or POD_IP's), or PADDLE_TRAINER_ID."""
    hosts, here = trainer_hosts(env), env.get("PADDLE_CURRENT_ENDPOINT", "").rsplit(":", 1)[0] or env.get("POD_IP")
    if here in hosts:
        return hosts.index(here)
    one_each = hosts and env.get("PADDLE_TRAINERS_NUM", str(len(hosts))) == str(len(hosts))  # a trainer a machine
    return number("PADDLE_TRAINER_ID", env["PADDLE_TRAINER_ID"]) if one_each and "PADDLE_TRAINER_ID" in env else None


def paddlejob_machine_index(env: Mapping[str, str]) -> int | None:
    """A PaddleJob pod's index: the operator gives worker 0 POD_IP_DUMMY, and names pods <job>-worker-<index>;
    AI Studio's PADDLE_MASTER jobs have the trainers' list (trainer_index())."""
    if "PADDLE_RANK" in env:
        return number("PADDLE_RANK", env["PADDLE_RANK"])
    if "POD_IP_DUMMY" in env:
        return 0
    job, pod = env.get("PADDLE_JOB_ID"), env.get("HOSTNAME", socket.gethostname())
    match = re.fullmatch(re.escape(job) + r"-worker-(\d+)", pod) if job else None
    return int(match.group(1)) if match else trainer_index(env)


def from_modelarts(env: Mapping[str, str]) -> Layout | None:
    if "MA_NUM_HOSTS" not in env and "VC_WORKER_HOSTS" not in env:
        return None
    hosts = [host.strip() for host in env.get("VC_WORKER_HOSTS", "").split(",") if host.strip()]
    nnodes = number("MA_NUM_HOSTS", env.get("MA_NUM_HOSTS", env.get("VC_WORKER_NUM", str(len(hosts) or 1))), minimum=1)
    gpus = env.get("MA_NUM_GPUS", "")
    index, nproc = number("VC_TASK_INDEX", env.get("VC_TASK_INDEX", "0")), int(gpus) if gpus.isdigit() else 0
    master = hosts[0] if hosts else ""  # none: decide() asks for MASTER_ADDR when there are several machines
    return Layout("ModelArts", nnodes, index, master, DEFAULT_PORT, nproc or None)


def decide(
    env: Mapping[str, str],
    visible_gpus: int,
    nodes: str = NODES,
    master_numbers_machines: bool = MASTER_NUMBERS_MACHINES,
    framework: str = FRAMEWORK,
    launcher: str = LAUNCHER,
) -> Layout:
    """The layout run.sh starts: the platform's, then the user's own variables, checked."""
    user_nnodes = "NNODES" in env
    layout = detect(env)
    if "NODE_RANK" in env:
        layout = layout._replace(node_rank=number("NODE_RANK", env["NODE_RANK"]))
    if env.get("MASTER_ADDR"):
        layout = layout._replace(master_addr=env["MASTER_ADDR"])
    user_port = number("MASTER_PORT", env["MASTER_PORT"], minimum=1) if env.get("MASTER_PORT") else None
    if user_port is not None:
        layout = layout._replace(master_port=user_port)
    if env.get("NPROC_PER_NODE"):
        nproc = number("NPROC_PER_NODE", env["NPROC_PER_NODE"], minimum=1)
    else:
        nproc = layout.nproc or (visible_gpus if visible_gpus > 0 else 1)
    layout = layout._replace(nproc=nproc)

    if nodes == "single" and layout.nnodes != 1:
        if user_nnodes:  # the words of earlier versions, which users and tests know
            raise PlatformError(
                "this project was baked for one machine (nodes=single); bake it again with nodes=multi "
                f"to use NNODES={env['NNODES']}"
            )
        raise PlatformError(
            f"{layout.platform} says this job has {layout.nnodes} machines, but this project was baked for one "
            "machine (nodes=single): bake it again with nodes=multi, or give the job one machine"
        )
    if layout.min_nnodes is not None and (why := roll_call.refusal(framework, launcher, env)):
        raise PlatformError(why)
    if layout.node_rank is not None and layout.node_rank >= layout.nnodes:
        raise PlatformError(
            f"NODE_RANK {layout.node_rank} is not below NNODES {layout.nnodes} ({layout.platform}): number the "
            f"machines 0 .. {layout.nnodes - 1}, each its own"
        )
    if layout.nnodes == 1:  # no rendezvous across machines: the launcher's own, on this one
        return layout._replace(master_addr="127.0.0.1", master_port=None)  # (a free port: MASTER_PORT is for machines)
    if layout.min_nnodes is not None:  # the rendezvous numbers the machines, again at every restart
        if user_nnodes and "NODE_RANK" not in env:
            layout = layout._replace(node_rank=None)  # which machine is the master's is not known here
        if framework == "paddle":
            return layout  # its machines meet in etcd, not at a master
    elif layout.node_rank is None and not master_numbers_machines:
        raise PlatformError(
            f"{layout.platform} does not say which machine this is: set NODE_RANK on every machine, 0 for the "
            f"one at {layout.master_addr or 'MASTER_ADDR'}"
        )
    if not layout.master_addr:
        raise PlatformError(f"{layout.platform} names no master for its {layout.nnodes} machines: set MASTER_ADDR")
    return layout


def visible_gpus() -> int:
    """The GPUs this machine's processes may use, as the framework counts them (CUDA_VISIBLE_DEVICES applied)."""
    if not hardware.nvidia_driver_present():
        return 0  # no NVIDIA driver here: importing the framework to count no GPU would only slow the start
    try:
        from . import framework_probe
    except ImportError:  # not installed yet (install_requirements=yes installs it after this): ask the driver
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
        return sum(line.startswith("GPU ") for line in listed.splitlines())
    return framework_probe.gpu_count()


def number(name: str, text: str, minimum: int = 0) -> int:
    value = int(text) if re.fullmatch(r"\s*\+?\d+\s*", text) else -1
    if value < minimum:
        raise PlatformError(f"{name}={text!r} is not a whole number of {minimum} or more")
    return value


def ranged(layout: Layout, name: str, text: str) -> Layout:
    """`layout` with the machines `text` gives: N, or MIN:MAX for an elastic job ("N:N" is N)."""
    fewest, most = roll_call.machine_range(name, text)
    return layout._replace(nnodes=most, min_nnodes=fewest if fewest < most else None)


def split_endpoint(name: str, endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.strip().rpartition(":")
    if not host or not port.isdigit():
        raise PlatformError(f"{name}={endpoint!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def join_timeout(env: Mapping[str, str]) -> float:
    text = env.get("JOIN_TIMEOUT") or str(DEFAULT_JOIN_TIMEOUT_S)
    try:
        return float(text)
    except ValueError:
        raise PlatformError(f"JOIN_TIMEOUT={text!r} is not a number of seconds") from None


def describe(layout: Layout, master_ip: str, output_dir: str) -> str:
    """The one line run.sh prints at start."""
    machine = "(numbered by the master)" if layout.node_rank is None else str(layout.node_rank)
    master = layout.master_addr if master_ip == layout.master_addr else f"{layout.master_addr} ({master_ip})"
    port = "a free port" if layout.master_port is None else f"port {layout.master_port}"
    processes = "process" if layout.nproc == 1 else "processes"
    machines, meeting = str(layout.nnodes), f"master {master}, {port}"
    if layout.min_nnodes is not None:
        job = roll_call.job_name(os.environ, __package__, layout.master_port)
        machine = "(numbered by the rendezvous)"
        machines = f"{layout.min_nnodes} to {layout.nnodes} (elastic, job {job})"
        if etcd := roll_call.etcd_endpoint(os.environ):
            meeting = f"master etcd {etcd}"
    return (
        f"platform: {layout.platform}; machine {machine} of {machines}; {layout.nproc} {processes} per machine; "
        f"{meeting}; outputs in {os.path.abspath(output_dir)}"
    )


# ----------------------------------------------------------------------------- run.sh's question


def main(argv: list[str]) -> None:
    script = os.environ.get("RUN_SCRIPT", "run.py")
    # A bad flag stops here, before any process starts.
    if script == "predict.py":
        args = _parsed(cli.parse_predict_args, argv)
        # Where its output goes: without --output, the task's default name in the working folder.
        output_dir = str(Path(args.output).resolve().parent) if args.output else os.getcwd()
        # The launcher's logs (with its copies of the environment): in the temporary folder, not beside the output.
        launch_logs = workspace.temporary_logs("predict", args.output or output_dir)
    else:
        args = _parsed(lambda given: cli.parse_args(given, quiet=True), argv)
        output_dir = args.output_dir
        # (--check writes nothing in the output folder: its launcher's logs go where predict.sh's go)
        launch_logs = workspace.temporary_logs("check", output_dir) if args.check else Path(output_dir, "launch-logs")
    env = os.environ
    try:
        gpus = visible_gpus()
        layout = decide(env, gpus)
        if shortage := gpu_shortage(layout.nproc, gpus, args.device):  # (--device auto or gpu: a GPU a process)
            raise PlatformError(shortage)
        check = script != "predict.py" and args.check
        if check and layout.min_nnodes is not None:  # a preflight meets all (NNODES's most), as a fixed job would
            layout = layout._replace(min_nnodes=None)
            if layout.node_rank is None and not MASTER_NUMBERS_MACHINES:
                raise PlatformError(
                    "--check meets every machine as a fixed job: set NODE_RANK on each, 0 on MASTER_ADDR's"
                )
        elif script != "predict.py" and layout.min_nnodes is not None:
            sizes = (layout.nproc, layout.min_nnodes, layout.nnodes)
            if why := roll_call.batch_refusal(args.global_batch_size, args.batch_size, *sizes):
                raise PlatformError(why)
        # The machine of rank 0 (which holds the folder while the job runs) checks before its launcher writes logs
        # there; the others share the folder with it.
        if script != "predict.py" and layout.node_rank == 0 and (busy := output_folder.in_use(output_dir)):
            raise PlatformError(busy)
        # --check: every wait ends within a minute, so that each problem is said while the user watches.
        wait_s = min(join_timeout(env), hardware.WAIT_S) if check else join_timeout(env)
        master_ip = layout.master_addr
        if layout.nnodes > 1:
            master_ip = hardware.resolve(layout.master_addr, wait_s)
        checked = []
        if check and layout.nnodes > 1:
            checked = hardware.network(layout, master_ip, args.device, gpus, wait_s)
    except PlatformError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    assignments = {
        "NNODES": layout.nnodes,
        "NODE_RANK": layout.node_rank,
        "NPROC_PER_NODE": layout.nproc,
        "MASTER_ADDR": master_ip,
        "MASTER_PORT": layout.master_port,
        "OUTPUT_DIR": output_dir,
        "LAUNCH_LOGS": str(launch_logs),
        "found": describe(layout, master_ip, output_dir),
        "checked": "\n".join(checked) or None,
    }
    if layout.min_nnodes is not None:  # run.sh starts the launcher's elastic mode, and tells the ranks their job
        assignments["MIN_NNODES"] = layout.min_nnodes
        assignments[roll_call.JOB_ID_VARIABLE] = roll_call.job_name(env, __package__, layout.master_port)
        assignments[roll_call.ETCD_VARIABLE] = roll_call.etcd_endpoint(env)
    if check:
        assignments["JOIN_TIMEOUT"] = f"{wait_s:g}"  # the launcher's wait for the other machines
    for name, value in assignments.items():
        print(f"unset {name}" if value is None else f"{name}={shlex.quote(str(value))}")


def _parsed(parse, argv: list[str]):
    """The script's arguments; --help: shell code that prints the help and ends run.sh (which runs this output)."""
    try:
        with contextlib.redirect_stdout(text := io.StringIO()):
            return parse(argv)
    except SystemExit as end:
        if end.code == 0:
            print(f"printf '%s' {shlex.quote(text.getvalue())}; exit 0")
        raise


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:  # Ctrl-C before anything started: run.sh ends with it, without a traceback
        sys.exit(INTERRUPTED_STATUS)
