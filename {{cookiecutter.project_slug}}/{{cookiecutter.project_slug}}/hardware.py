"""What this machine has, asked without any framework: the standard library only."""

import shutil
from pathlib import Path


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
