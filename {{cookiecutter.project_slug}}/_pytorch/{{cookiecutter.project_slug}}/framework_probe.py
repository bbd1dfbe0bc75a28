"""What `bash run.sh --check` (preflight.py) asks of the framework: its build, and one timed all-reduce."""

import time

import torch
import torch.distributed as dist


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
