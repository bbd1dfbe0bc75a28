"""What the installed framework can do on this machine: the GPUs it can use (or why none), its build; and what
`bash run.sh --check` (preflight.py) asks of it, one timed all-reduce."""

import time

import torch
import torch.distributed as dist

from . import hardware
from .errors import UserError, gpu_shortage, unusable_gpus


def framework_build() -> str:
    """The framework's version and what it was built for: every machine of a job needs the same."""
    built_for = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return f"torch {torch.__version__} ({built_for})"


def timed_all_reduce(count: int, device) -> tuple[float, float]:
    """(seconds, sum): one all-reduce of `count` ones in float32 over every rank, on the job's backend; each
    element's sum is then the world size."""
    dist.all_reduce(torch.ones(8, device=device))  # the first collective sets up the connections: not timed
    values = torch.ones(count, dtype=torch.float32, device=device)
    started = time.perf_counter()
    dist.all_reduce(values)
    total = values[-1].item()  # waits for the GPU
    return time.perf_counter() - started, total


def gpu_available() -> bool:
    return torch.cuda.is_available()


def gpu_count() -> int:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES applied), asked of NVML: CUDA is not initialised."""
    return torch.cuda.device_count()


def gpu_problem() -> str | None:
    """Why this torch cannot use the GPUs that the NVIDIA driver shows; None where it can, or there are none."""
    if gpu_available() or not hardware.nvidia_driver_present():
        return None
    cpu_build_fix = "install a CUDA build of torch (README.md, Installing)"
    return unusable_gpus(f"torch {torch.__version__}", torch.version.cuda, cpu_build_fix)


def check_gpus_for(nproc: int, device: str) -> None:
    """Before starting `nproc` processes on this machine: with --device auto or gpu each takes a GPU of its own."""
    shortage = gpu_shortage(nproc, gpu_count() if device != "cpu" else 0, device)
    if shortage:
        raise UserError(shortage)
