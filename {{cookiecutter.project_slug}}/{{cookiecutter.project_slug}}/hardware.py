"""What this machine has, asked without any framework (the standard library only): its cores, whether an NVIDIA
driver shows GPUs, this process's place in the job (DistEnv) and its GPU, the loader workers, mixed precision and
synchronised batch norm that suit it; and its network, which platforms.py asks
about before the launcher starts (the master's name and port, the interface that reaches it; `bash run.sh --check`
says what it found). Each function answers for the paths and numbers it is given, so a test can hand it others.
"""

import contextlib
import fcntl
import ipaddress
import logging
import os
import shutil
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import PlatformError, UserError, more_processes_than_gpus

_log = logging.getLogger(__name__)

# Every wait of a check ends within this, so that each problem is one line within a minute of the last start.
WAIT_S = 40.0


def nvidia_driver_present() -> bool:
    """True where an NVIDIA driver shows GPUs to this process (its device nodes, or its nvidia-smi tool)."""
    return any(Path(node).exists() for node in ("/dev/nvidiactl", "/dev/dxg")) or shutil.which("nvidia-smi") is not None


def cuda_driver_loaded() -> bool:
    """True once this process has loaded the CUDA driver library: torch.cuda.is_available() does, even while
    torch.cuda.is_initialized() stays False, and a process forked from it then cannot use CUDA."""
    try:
        return "libcuda.so" in Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: nothing to read, and no fork there either
        return False


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity (a SLURM allocation, taskset), capped by its
    container's CPU quota (a Kubernetes pod's limit), not the host's count that os.cpu_count() gives."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota(cgroup)
    return max(1, min(cores, int(quota))) if quota is not None else cores


def cpu_quota(cgroup: Path) -> float | None:
    """The container's CPU quota in cores (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us / cpu.cfs_period_us);
    None where there is none."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]  # "max 100000", or "200000 100000"
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()  # -1: no quota
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1") or int(period) <= 0:
        return None
    return int(quota) / int(period)


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job (distributed.setup()'s answer)."""

    rank: int
    local_rank: int
    world_size: int
    device: object  # the framework's own device value: a torch.device, or a paddle device string ("cpu", "gpu:0")

    local_world_size: int = 1  # the processes of this machine

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def on_gpu(self) -> bool:
        return str(self.device).startswith(("cuda", "gpu"))


def gpu_of_rank(asked: str, index: int, gpus: int, problem: str | None, processes: int, warns: bool) -> int | None:
    """This rank's GPU under --device `asked` (auto, gpu or cpu), or None for the CPU: `index`, the one its launcher
    gave it, of the `gpus` the framework counts, none of them usable where `problem` says why (a CPU build, a driver
    too old: torch may still count them). --device gpu without a usable GPU, or more processes on this machine
    (`processes`) than GPUs, is a UserError; auto on GPUs the framework cannot use warns (where `warns`: once per
    machine) and trains on the CPU."""
    if asked == "cpu":
        return None
    gpus = 0 if problem else gpus
    if asked == "gpu" and not gpus:
        raise UserError(f"--device gpu: {problem or 'no GPU is visible'}; or use --device cpu or auto")
    if problem and warns:
        print(f"warning: {problem}; training on the CPU", file=sys.stderr, flush=True)
    if not gpus:
        return None
    if index >= gpus:  # started by a launcher with more processes than GPUs
        raise UserError(more_processes_than_gpus(processes, gpus), shown=index == gpus)
    return index


def synchronises_batch_norm(asked: bool, layers: int, processes: int, on_gpu: bool) -> bool:
    """--sync-bn: whether the model's `layers` batch normalisations are computed over the global batch: on several
    GPU processes. The frameworks' synchronised layer has no CPU kernel: on CPUs each process goes on normalising
    its own batch, and the log says so."""
    if not asked or processes == 1:
        return False
    if not on_gpu:
        _log.info(
            "--sync-bn: synchronised batch norm runs on GPUs only; on the CPU each process normalises its own batch"
        )
        return False
    _log.info("--sync-bn: %d batch-norm layer(s) synchronised across %d processes", layers, processes)
    return True


def loader_cores(on_gpu: bool, processes: int, cores: int) -> int:
    """The cores each process's loader workers may use: on GPUs the process's share of `cores` less the one
    its training loop runs on; on CPUs none (the training's own threads use them all)."""
    return max(0, cores // max(processes, 1) - 1) if on_gpu else 0


def loader_workers(on_gpu: bool, processes: int, cores: int) -> int:
    """The default --workers of each process: on GPUs one per loader core, at least 1 and at most 8 (more
    feeds no GPU faster, and costs memory); on CPUs none, which the CPU benchmarks show is fastest."""
    return max(1, min(8, loader_cores(on_gpu, processes, cores))) if on_gpu else 0


def amp_dtype(amp: bool, asked: str, capability: tuple[int, int] | None) -> str | None:
    """The mixed-precision dtype of a run on a GPU of compute `capability` (None: no GPU): None for full
    precision (--no-amp, or a CPU); with --amp-dtype auto, "bf16" where the GPU runs bfloat16 natively
    (compute capability 8.0 or more; T4 and V100 only emulate it), else "fp16", which needs loss scaling."""
    if not amp or capability is None:
        return None
    native_bf16 = tuple(capability) >= (8, 0)
    if asked == "bf16" and not native_bf16:
        raise UserError(
            f"--amp-dtype bf16: this GPU (compute capability {capability[0]}.{capability[1]}) has no native "
            "bfloat16 (8.0 or more): use --amp-dtype fp16 or auto"
        )
    if asked == "auto":
        return "bf16" if native_bf16 else "fp16"
    return asked


def network(layout, master_ip: str, device: str, gpus: int, wait_s: float = WAIT_S) -> list[str]:
    """run.sh --check, before the launcher, for platforms.py's `layout`: the master resolves, its port answers
    within `wait_s` (machine 0: run.sh checks that it is free), and the interface that reaches it. The `check`
    lines; a PlatformError for a problem."""
    lines = [f"check master: {layout.master_addr} is {master_ip}"]
    # Machine 0 hosts the port itself (a PaddleJob numbers its machines later: the one holding the master's address).
    hosts_master = layout.node_rank == 0 or (layout.node_rank is None and interface_of(master_ip))
    if not hosts_master:
        if not wait_for_port(master_ip, layout.master_port, wait_s):
            raise PlatformError(master_silent(master_ip, layout.master_port, f"{wait_s:g} s"))
        lines.append(f"check port: {master_ip}:{layout.master_port} answers")
    on_gpu = device != "cpu" and gpus > 0
    said, variable = interface_advice(master_ip, layout.master_port, on_gpu)
    lines.append(f"check interface: {said}" + (f": export {variable} on this machine" if variable else ""))
    return lines


def wait_for_port(host: str, port: int, wait_s: float = WAIT_S) -> bool:
    """True once something accepts connections on host:port (machine 0's launcher, started later, may not yet)."""
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(OSError):
            with socket.create_connection((host, port), timeout=2.0):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


def master_silent(host: str, port: int, waited: str) -> str:
    """The error of a machine that waited `waited` (its limit, said as the user sets it) for the master's port."""
    return (
        f"nothing answers on the master's port {host}:{port} within {waited}: start machine 0 (NODE_RANK=0) too, with "
        "the same NNODES, MASTER_ADDR (its own address) and MASTER_PORT, and check that its firewall lets the port in"
    )


def route_to(master_ip: str, port: int) -> str:
    """This machine's address on the way to the master: the kernel's routing choice (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_ip, port))
        return probe.getsockname()[0]


def ipv4_of(interface: str) -> str | None:
    """The IPv4 address of a network interface (eth0, ib0, lo, ...); None where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
        try:
            # SIOCGIFADDR: the interface's address, in a struct ifreq
            answer = fcntl.ioctl(query.fileno(), 0x8915, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def interface_of(address: str) -> str | None:
    """The network interface that holds `address`; None where none does."""
    return next((name for _, name in socket.if_nameindex() if ipv4_of(name) == address), None)


def gloo_default_address() -> str | None:
    """The address gloo takes when GLOO_SOCKET_IFNAME is unset: what this machine's host name resolves to."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def nccl_default_interface() -> str | None:
    """The interface NCCL takes when NCCL_SOCKET_IFNAME is unset: InfiniBand first, then any but lo and docker*."""
    names = sorted(name for _, name in socket.if_nameindex() if ipv4_of(name))
    for chosen in (lambda name: name.startswith("ib"), lambda name: not name.startswith(("lo", "docker"))):
        found = [name for name in names if chosen(name)]
        if found:
            return found[0]
    return None


def interface_advice(master_ip: str, port: int, on_gpu: bool, env=os.environ) -> tuple[str, str | None]:
    """(the line saying which interface reaches the master, the variable to set where the backend's default
    would take another one, or None)."""
    try:
        address = route_to(master_ip, port)
    except OSError as error:  # an IPv6 master, no route: the launcher will say more
        return f"no route to the master {master_ip} found ({error.strerror or error})", None
    interface = interface_of(address) or address
    variable = "NCCL_SOCKET_IFNAME" if on_gpu else "GLOO_SOCKET_IFNAME"
    line = f"{interface} ({address}) reaches the master {master_ip}"
    if env.get(variable):
        return f"{line}; {variable}={env[variable]} is set", None
    if on_gpu:
        default = nccl_default_interface()
        differs = default not in (interface, None)
    else:  # gloo binds to what the host name resolves to, else to the loopback (Debian maps it to 127.0.1.1)
        default_address = gloo_default_address()
        default = interface_of(default_address or "") or default_address or "the loopback"
        differs = default_address != address
    if not differs or master_ip.startswith("127."):  # a master on the loopback: every machine is this one
        return f"{line}; {variable} unset, the default is the same", None
    return f"{line}, but {variable} unset would take {default}", f"{variable}={interface}"


def resolve(host: str, timeout_s: float, lookup=socket.gethostbyname, sleep=time.sleep) -> str:
    """The IP address of `host`, asked again every second while it does not resolve yet (Kubernetes names
    appear seconds after the pods), up to `timeout_s`. Paddle's launcher hosts the master only when given
    one of its own IP addresses, never a name; torch takes either."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    deadline = time.monotonic() + timeout_s
    told = False
    while True:
        try:
            return lookup(host)
        except OSError:  # socket.gaierror: not (yet) known
            pass
        if time.monotonic() >= deadline:
            raise PlatformError(
                f"the master's host name {host!r} did not resolve within JOIN_TIMEOUT={timeout_s:g} s: check "
                "MASTER_ADDR (or what the platform set), or raise JOIN_TIMEOUT"
            )
        if not told:
            print(
                f"waiting for the master's host name {host} to resolve (JOIN_TIMEOUT={timeout_s:g} s)", file=sys.stderr
            )
            told = True
        sleep(1.0)
