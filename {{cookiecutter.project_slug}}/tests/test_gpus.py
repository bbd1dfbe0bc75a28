"""Processes and GPUs, decided without a GPU: the GPU count is a function these tests give other answers."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_of_project

from {{ cookiecutter.project_slug }} import distributed, framework_probe, hardware, notebook, platforms
from {{ cookiecutter.project_slug }}.errors import UserError, gpu_shortage
from {{ cookiecutter.project_slug }}.settings import FRAMEWORK

# Imported first by every Python process started with this folder on PYTHONPATH: the framework then counts
# GPUS GPUs (and says it can use them), as on a GPU machine.
FAKE_GPUS = {
    "pytorch": "import os, torch\ntorch.cuda.device_count = lambda: int(os.environ['FAKE_GPUS'])\n",
    "paddle": "import os, warnings\nwarnings.filterwarnings('ignore', 'No ccache found')\nimport paddle\npaddle.device.is_compiled_with_cuda = lambda: True\n"
    "paddle.device.cuda.device_count = lambda: int(os.environ['FAKE_GPUS'])\n",
}[FRAMEWORK]


@pytest.fixture
def gpus(monkeypatch):
    """Give this process `count` GPUs that the framework can use."""

    def machine_with(count: int) -> None:
        monkeypatch.setattr(framework_probe, "gpu_count", lambda: count)
        monkeypatch.setattr(framework_probe, "gpu_available", lambda: count > 0)

    return machine_with


@pytest.fixture
def gpu_machine(tmp_path) -> dict:
    """The environment of a command that runs on a machine with an NVIDIA driver and FAKE_GPUS GPUs."""
    fake = tmp_path / "fake_gpus"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(FAKE_GPUS)
    smi = fake / "nvidia-smi"  # the driver's tool: run.sh then asks the framework for the count
    smi.write_text("#!/bin/sh\necho 'GPU 0: fake'\n")
    smi.chmod(0o755)
    return {
        "PATH": f"{fake}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": f"{fake}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }


def run_sh(project_root, script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("NPROC_PER_NODE", "CUDA_VISIBLE_DEVICES")}
    return subprocess.run(
        ["bash", script, *args], cwd=project_root, env={**environment, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("script", ["run.sh", "predict.sh"])
def test_more_processes_than_gpus_stops_run_sh_with_one_line_before_anything_starts(
    script, project_root, gpu_machine, tmp_path
):
    args = ["--output-dir", str(tmp_path / "out")] if script == "run.sh" else ["--input", str(tmp_path)]
    result = run_sh(project_root, script, {**gpu_machine, "FAKE_GPUS": "1", "NPROC_PER_NODE": "2"}, *args)

    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: 2 processes on this machine, but it has 1 visible GPU")
    assert all(way in lines[0] for way in ("NPROC_PER_NODE=1", "CUDA_VISIBLE_DEVICES", "--device cpu"))
    assert not (tmp_path / "out").exists()


def test_a_check_of_more_processes_than_gpus_is_the_same_one_line(project_root, gpu_machine, tmp_path):
    env = {**gpu_machine, "FAKE_GPUS": "1", "NPROC_PER_NODE": "2"}

    result = run_sh(project_root, "run.sh", env, "--check", "--output-dir", str(tmp_path / "out"))

    assert result.returncode == 1
    assert [line[:60] for line in result.stderr.strip().splitlines()] == [
        "error: 2 processes on this machine, but it has 1 visible GPU"
    ]


def test_with_device_cpu_any_number_of_processes_may_share_a_gpu_machine(project_root, gpu_machine):
    env = {**gpu_machine, "FAKE_GPUS": "1", "NPROC_PER_NODE": "3", "DRY_RUN": "1"}
    result = run_sh(project_root, "run.sh", env, "--device", "cpu")

    assert result.returncode == 0, result.stderr
    assert "3 processes per machine" in result.stdout


def test_processes_per_machine_default_to_the_gpus_the_framework_counts(project_root, gpu_machine):
    result = run_sh(project_root, "run.sh", {**gpu_machine, "FAKE_GPUS": "4", "DRY_RUN": "1"})

    assert result.returncode == 0, result.stderr
    assert "4 processes per machine" in result.stdout


def test_run_sh_runs_where_only_python3_is_on_the_path(project_root, tmp_path):
    bin_dir = tmp_path / "bin"  # python3, bash and the tools run.sh uses; no `python`
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in ("bash", "nproc", "dirname", "cat", "rm", "tail", "grep", "hostname"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    assert shutil.which("python", path=str(bin_dir)) is None

    result = run_sh(project_root, "run.sh", {"PATH": str(bin_dir), "DRY_RUN": "1"})

    assert result.returncode == 0, result.stderr
    assert "would run:" in result.stdout and "python3" in result.stdout


@pytest.mark.parametrize("nproc, count, device", [(2, 1, "auto"), (3, 2, "gpu"), (9, 8, "auto")])
def test_more_processes_than_visible_gpus_are_one_line_saying_so(nproc, count, device):
    assert f"{nproc} processes on this machine, but it has {count} visible" in gpu_shortage(nproc, count, device)


@pytest.mark.parametrize("nproc, count, device", [(2, 0, "auto"), (2, 1, "cpu"), (8, 8, "auto"), (1, 1, "gpu")])
def test_one_gpu_a_process_or_no_gpu_at_all_is_no_shortage(nproc, count, device):
    assert gpu_shortage(nproc, count, device) is None


def test_a_machine_without_an_nvidia_driver_counts_no_gpu_without_asking_the_framework(monkeypatch):
    monkeypatch.setattr(hardware.Path, "exists", lambda self: False)
    monkeypatch.setattr(hardware.shutil, "which", lambda name: None)
    monkeypatch.setattr(framework_probe, "gpu_count", lambda: pytest.fail("the framework was asked"))

    assert platforms.visible_gpus() == 0


def test_a_rank_started_without_a_gpu_of_its_own_stops_with_the_same_line(gpus, monkeypatch):
    gpus(1)  # torchrun or srun started 2 ranks on a machine with 1 GPU, without run.sh
    ranks = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    paddle_ranks = {"PADDLE_TRAINER_ID": "1", "PADDLE_LOCAL_RANK": "1", "PADDLE_TRAINERS_NUM": "2"}
    for name, value in {**ranks, **paddle_ranks, "FLAGS_selected_gpus": "1", "PADDLE_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(UserError, match="2 processes on this machine, but it has 1 visible GPU"):
        distributed.setup("auto", timeout_s=5)


def test_the_spawn_launcher_refuses_more_processes_than_gpus_before_it_starts_any(gpus, monkeypatch, capsys):
    gpus(1)
    monkeypatch.setattr(distributed, "LAUNCHER", "spawn")
    monkeypatch.setenv("NPROC_PER_NODE", "2")
    for name in ("LOCAL_RANK", "PADDLE_TRAINER_ID", "SLURM_NTASKS", "NNODES"):
        monkeypatch.delenv(name, raising=False)
    args = type("Args", (), {"device": "auto"})()

    with pytest.raises(SystemExit) as exited:
        distributed.launch(lambda args: pytest.fail("a rank started"), args)

    assert str(exited.value.code).startswith("error: 2 processes on this machine, but it has 1 visible GPU")


def test_notebook_launch_refuses_more_processes_than_gpus_before_it_starts_any(gpus, monkeypatch):
    gpus(1)
    monkeypatch.setattr(notebook, "Ranks", lambda *args: pytest.fail("ranks started"))

    with pytest.raises(UserError, match="2 processes on this machine, but it has 1 visible GPU"):
        notebook.launch(["--synthetic"], nproc=2, train=print)


OUT_OF_MEMORY = {
    "pytorch": "torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity')",
    "paddle": "MemoryError('ResourceExhaustedError: Out of memory error on GPU 0. Cannot allocate 20.000000GB memory')",
}[FRAMEWORK]

# Appended to model.py: every forward pass runs out of GPU memory, in the framework's words.
OUT_OF_MEMORY_MODEL = f"""

import functools

_build_model = build_model


@functools.wraps(_build_model)  # the same parameters: the data description fills them as before
def build_model(num_classes, **options):  # noqa: F811
    network = _build_model(num_classes, **options)

    def full(*args):
        raise {OUT_OF_MEMORY}

    register = getattr(network, 'register_forward_post_hook', None) or network.register_forward_hook
    register(full)
    return network
"""


def test_running_out_of_gpu_memory_is_one_line_naming_the_flags_that_lower_it(project_root, tmp_path):
    project = copy_of_project(project_root, tmp_path / "project", model=OUT_OF_MEMORY_MODEL)
    command = [sys.executable, "run.py", "--synthetic", "--epochs", "1", "--device", "cpu"]

    result = subprocess.run(
        [*command, "--output-dir", str(tmp_path / "out")], cwd=project, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if line.strip() and "ccache" not in line]
    assert line.startswith("error: out of memory (") and "GPU 0" in line, result.stderr
    assert all(flag in line for flag in ("--batch-size", "--grad-accum", "--global-batch-size"))
    assert "Traceback" not in result.stderr


@pytest.fixture
def driver_without_usable_gpus(monkeypatch):
    """An NVIDIA driver shows GPUs, but the installed framework (here: a CPU build) cannot use them."""
    monkeypatch.setattr(framework_probe.hardware, "nvidia_driver_present", lambda: True)
    monkeypatch.setattr(framework_probe, "gpu_available", lambda: False)
    monkeypatch.setattr(framework_probe, "gpu_count", lambda: 0)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)


def test_device_gpu_with_gpus_the_framework_cannot_use_is_one_line_saying_why(driver_without_usable_gpus, monkeypatch):
    if FRAMEWORK == "pytorch":
        monkeypatch.setattr(framework_probe.torch.version, "cuda", None)
    else:
        monkeypatch.setattr(framework_probe.paddle.device, "is_compiled_with_cuda", lambda: False)

    with pytest.raises(UserError, match="--device gpu: this .* is a CPU build: install "):
        distributed.setup("gpu")


def test_device_auto_says_why_it_trains_on_the_cpu_where_gpus_cannot_be_used(driver_without_usable_gpus, capsys):
    env = distributed.setup("auto")

    assert not env.on_gpu
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("warning: ") and line.endswith("; training on the CPU")


def test_gpus_the_framework_counts_but_cannot_use_leave_it_on_the_cpu(driver_without_usable_gpus, monkeypatch, capsys):
    monkeypatch.setattr(framework_probe, "gpu_count", lambda: 2)  # torch counts a too-old driver's GPUs (NVML)

    assert not distributed.setup("auto").on_gpu
    assert capsys.readouterr().err.strip().endswith("; training on the CPU")


def test_a_machine_without_gpus_trains_on_the_cpu_without_a_word(gpus, monkeypatch, capsys):
    gpus(0)
    monkeypatch.setattr(framework_probe.hardware, "nvidia_driver_present", lambda: False)

    assert not distributed.setup("auto").on_gpu
    assert capsys.readouterr().err == ""


def test_after_the_kernel_started_the_cuda_driver_a_notebook_function_is_refused_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr(hardware, "cuda_driver_loaded", lambda: True)  # as after torch.cuda.is_available()
    monkeypatch.setattr(notebook, "Ranks", lambda *args: pytest.fail("ranks started"))

    def defined_in_a_cell(args):
        pass

    with pytest.raises(UserError, match=r"cannot start defined_in_a_cell\(\) here: this kernel has started the CUDA"):
        notebook.launch(["--synthetic"], nproc=2, train=defined_in_a_cell)


def test_after_the_kernel_started_the_cuda_driver_run_py_training_starts_with_spawn(monkeypatch):
    monkeypatch.setattr(hardware, "cuda_driver_loaded", lambda: True)
    started = []

    class Ranks:  # what would start the ranks: it records how
        def __init__(self, context, *args):
            started.append(context.get_start_method())

        def run(self):
            pass

    monkeypatch.setattr(notebook, "Ranks", Ranks)

    notebook.launch(["--synthetic", "--device", "cpu"], nproc=2)

    assert started == ["spawn"]
