"""Training from a Jupyter kernel: one process inside it, or several started from it.

    from {{ cookiecutter.project_slug }} import notebook
    notebook.train_here(["--epochs", "1"])            # run.py's training, in this process
    notebook.launch(["--epochs", "3"], nproc=2)       # ... on 2 processes started from this kernel
    notebook.launch([], nproc=2, train=my_function)   # a function defined in the notebook, on every rank

launch() gives each rank the variables a launcher sets (distributed.rank_environment()), so
the project's distributed setup works unchanged. The ranks are forked from the kernel, as
accelerate's notebook_launcher does: a function defined in a notebook cell cannot be pickled
by reference, so spawn (what torch.multiprocessing.spawn and paddle.distributed.spawn use)
cannot run it. A forked process cannot use CUDA once the kernel has initialised it; then
run.py's training, and any function importable from a .py file, start with spawn instead,
and a notebook-defined function is refused with one line that says what to do.

Each rank reports how it ended through a pipe: a failure comes back as one exception in the
kernel, with that rank's error as its message. Ranks run in their own process groups (the
stop button interrupts the kernel, which then stops them with SIGTERM, so the project's
training saves a checkpoint first) and die with the kernel if it dies.
"""

import contextlib
import importlib
import io
import multiprocessing
import shlex
import signal
import sys
from datetime import datetime
from pathlib import Path

from . import cli, hardware
from .errors import UserError
from .kernel_ranks import (
    RankFailed,  # noqa: F401 - launch() raises it: a notebook catches notebook.RankFailed
    Ranks,
    call_reporting_exits,
    close_package_logger,
    environment,
    free_port,
    reported_error,
)
from .workspace import PROJECT_ROOT


def launch(argv: list[str] | str, nproc: int = 2, train=None, config: str | Path | None = None) -> None:
    """Run `train(cli.parse_args(argv))` on `nproc` processes started from this kernel, and wait for them.
    `config`: a YAML file of run.py's options, as --config FILE (argv's own win).

    `train` defaults to run.py's training. Raises RankFailed with the first failing rank's
    error (UserError for bad arguments); on KeyboardInterrupt every rank is stopped first.
    A `train` of your own that joins the process group ends as run.py's does: distributed.barrier(),
    then distributed.cleanup(), so that no rank leaves while another still talks to it.
    """
    args = parse(argv, config)
    if not isinstance(nproc, int) or nproc < 1:
        raise UserError(f"nproc must be a whole number of processes, 1 or more; got {nproc!r}")
    from . import framework_probe

    framework_probe.check_gpus_for(nproc, args.device)
    train = train if train is not None else run_py_train()
    blocker = fork_blocker()
    if blocker is None:
        context = multiprocessing.get_context("fork")
    elif importable(train):
        context = multiprocessing.get_context("spawn")
    else:
        name = getattr(train, "__name__", "train")
        raise UserError(
            f"launch() cannot start {name}() here: {blocker}. Move {name}() into a .py file beside the notebook and "
            "import it from there (launch() then starts fresh processes with spawn), or restart the kernel and call "
            "launch() before anything uses the GPU"
        )
    Ranks(context, train, args, nproc).run()


def train_here(argv: list[str] | str, train=None, config: str | Path | None = None) -> None:
    """Run `train(cli.parse_args(argv))` in this process: the one-process run, with no launcher variables;
    `config` as launch()'s.

    A UserError comes back as itself instead of ending the kernel with SystemExit; the
    kernel's SIGTERM handler and the package logger are as they were afterwards.
    """
    args = parse(argv, config)
    train = train if train is not None else run_py_train()
    from . import distributed

    single = distributed.rank_environment(0, 0, 1, "127.0.0.1", free_port())
    previous_handler = signal.getsignal(signal.SIGTERM)
    try:
        with environment(single):
            status, message = call_reporting_exits(train, args)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        close_package_logger()
    if status == "error":
        raise reported_error(message)
    if status == "stopped":
        raise KeyboardInterrupt(message)


def fresh_output_dir(parent: str | Path | None = None) -> Path:
    """A new, empty folder named after the time under `parent` (default output/notebook): each run trains afresh."""
    parent = Path(parent) if parent is not None else PROJECT_ROOT / "output" / "notebook"
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for suffix in ("", *(f"-{n}" for n in range(2, 1000))):
        folder = parent / f"{stamp}{suffix}"
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise UserError(f"could not make a new folder under {parent}: clear it out")


def fork_blocker() -> str | None:
    """Why a forked process could not do its work here, or None when forking is fine."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this system cannot fork processes"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in this kernel (PyTorch has used the GPU), and a forked process cannot use it"
    if hardware.cuda_driver_loaded():
        return (
            "this kernel has started the CUDA driver (torch.cuda.is_available() does), and a forked process cannot "
            "use CUDA"
        )
    paddle = sys.modules.get("paddle")
    if paddle is not None and paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return "paddle's GPU build initialises CUDA when it is imported, and a forked process cannot use it"
    return None


def importable(function) -> bool:
    """True if a fresh process can import `function` by its module and name (as spawn pickles it)."""
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if module in (None, "__main__") or "<" in name:
        return False
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return False
    return found is function


def run_py_train():
    """run.py's training: training.train(args)."""
    from .training import train  # here: importing the notebook module must not import the framework

    return train


def parse(argv: list[str] | str, config: str | Path | None = None):
    """run.py's arguments (with --config `config`); a bad one is a UserError with argparse's message, not a
    SystemExit of the kernel."""
    argv = shlex.split(argv) if isinstance(argv, str) else [str(arg) for arg in argv]
    argv = ["--config", str(config), *argv] if config is not None else argv
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return cli.parse_args(argv)
    except SystemExit:
        lines = captured.getvalue().strip().splitlines() or ["bad arguments"]
        raise UserError(lines[-1].removeprefix("error: ")) from None
