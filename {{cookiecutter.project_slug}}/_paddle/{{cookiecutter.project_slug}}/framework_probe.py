"""What `bash run.sh --check` (preflight.py) asks of the framework: its build, and one timed all-reduce."""

import time

import paddle
import paddle.distributed as dist


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
