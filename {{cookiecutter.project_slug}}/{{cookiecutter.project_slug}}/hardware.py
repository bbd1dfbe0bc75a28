"""What this machine has, asked without any framework: the standard library only."""

import shutil
from pathlib import Path


def nvidia_driver_present() -> bool:
    """True where an NVIDIA driver shows GPUs to this process (its device nodes, or its nvidia-smi tool)."""
    return any(Path(node).exists() for node in ("/dev/nvidiactl", "/dev/dxg")) or shutil.which("nvidia-smi") is not None
