"""What this machine has, asked without any framework: the standard library only."""

import os
import shutil
from pathlib import Path

from .errors import UserError


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
