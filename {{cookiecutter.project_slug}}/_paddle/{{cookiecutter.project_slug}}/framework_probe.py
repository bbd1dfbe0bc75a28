"""What the installed framework can do on this machine: the GPUs it can use (or why none), its build; and what
`bash run.sh --check` (preflight.py) asks of it, one timed all-reduce."""

import time

import paddle
import paddle.distributed as dist

from . import hardware
from .errors import UserError, gpu_shortage, unusable_gpus


def framework_build() -> str:
    """The framework's version and what it was built for: every machine of a job needs the same."""
    built_for = f"CUDA {paddle.version.cuda()}" if paddle.device.is_compiled_with_cuda() else "CPU build"
    return f"paddle {paddle.__version__} ({built_for})"


def timed_all_reduce(count: int, device) -> tuple[float, float]:
    """(seconds, sum): one all-reduce of `count` ones in float32 over every rank, on the job's backend; each
    element's sum is then the world size. (`device` is PyTorch's need: distributed.setup() set paddle's.)"""
    dist.all_reduce(paddle.ones([8]))  # the first collective sets up the connections: not timed
    values = paddle.ones([count], dtype="float32")
    started = time.perf_counter()
    dist.all_reduce(values)
    total = float(values[-1])  # waits for the GPU
    return time.perf_counter() - started, total


def gpu_available() -> bool:
    return gpu_count() > 0


def gpu_count() -> int:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES applied); 0 with a CPU build of paddle."""
    return paddle.device.cuda.device_count() if paddle.device.is_compiled_with_cuda() else 0


def gpu_problem() -> str | None:
    """Why this paddle cannot use the GPUs that the NVIDIA driver shows; None where it can, or there are none."""
    if gpu_available() or not hardware.nvidia_driver_present():
        return None
    cuda = paddle.version.cuda() if paddle.device.is_compiled_with_cuda() else None
    return unusable_gpus(f"paddle {paddle.__version__}", cuda, "install paddlepaddle-gpu for your CUDA (README.md)")


def check_gpus_for(nproc: int, device: str) -> None:
    """Before starting `nproc` processes on this machine: with --device auto or gpu each takes a GPU of its own."""
    shortage = gpu_shortage(nproc, gpu_count() if device != "cpu" else 0, device)
    if shortage:
        raise UserError(shortage)
