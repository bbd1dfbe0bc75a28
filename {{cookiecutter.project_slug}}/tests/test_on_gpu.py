"""The GPU tier: the GPU path itself, run where the framework can use a GPU (`pytest -m gpu`), skipped elsewhere.

Everything trains in processes of its own, so that CUDA is never initialised in the pytest process (a forked
rank of notebook.launch() could not use it after that). A run about the CPU hides CUDA from its process.
The tier is short when its tests share runs: one ten-epoch GPU run and one CPU run answer several tests each,
in one test process apiece under `pytest -n 4 --dist loadgroup` (their xdist_group), the other tests beside them.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SLOW_DATA, copy_of_project

from {{ cookiecutter.project_slug }} import framework_probe, task, workspace
from {{ cookiecutter.project_slug }}.settings import DATASET, FRAMEWORK

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
CHECKPOINT = "best.pt" if FRAMEWORK == "pytorch" else "best.pdparams"
LAST = CHECKPOINT.replace("best", "last")
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES", "NODE_RANK", "PADDLE_TRAINER_ID", "SLURM_NTASKS")
READS_GPU_RUN, READS_CPU_RUN = pytest.mark.xdist_group("gpu-run"), pytest.mark.xdist_group("cpu-run")


def environment(nproc: int = 1, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return {**env, "NPROC_PER_NODE": str(nproc), **extra}


def data_args(output: Path) -> list[str]:
    if DATASET == "zip":  # extracted into the test's own folder, not the project's data/
        return ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    return []


def train(project: Path, output: Path, *args: str, nproc: int = 1, check: bool = True, **env: str):
    result = subprocess.run(
        ["bash", "run.sh", "--output-dir", str(output), *data_args(output), *args], cwd=project,
        env=environment(nproc, **env), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0 or not check, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def evaluate(project: Path, checkpoint: Path, output: Path, **env: str) -> dict:
    """`run.sh --evaluate` of `checkpoint` on the validation set, in one process: its eval.json."""
    train(project, output, "--evaluate", "--resume", str(checkpoint), **env)
    return json.loads((output / "eval.json").read_text(encoding="utf-8"))


def assert_same_metrics(on_gpu: dict, on_cpu: dict) -> None:
    """The same metrics of the same samples; TF32 and mixed precision on the GPU may move them a little
    (flip a borderline sample's class)."""
    assert on_gpu.keys() == on_cpu.keys() and on_gpu["val_samples"] == on_cpu["val_samples"]
    for name, value in on_gpu.items():
        assert value == pytest.approx(on_cpu[name], rel=0.01, abs=0.01), name


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory, project_root) -> Path:
    """Ten epochs with mixed precision on the GPU; its output folder."""
    output = tmp_path_factory.mktemp("gpu") / "output"
    train(project_root, output, "--epochs", "10", "--device", "gpu", "--amp")
    return output


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, project_root) -> Path:
    """Two epochs with CUDA hidden; its output folder."""
    output = tmp_path_factory.mktemp("cpu") / "output"
    train(project_root, output, "--epochs", "2", **CPU_ONLY)
    return output


@READS_GPU_RUN
def test_ten_epochs_with_mixed_precision_learn_better_than_the_first_epochs_best_metric(gpu_run):
    assert "1 process(es) on gpu" in (gpu_run / "train.log").read_text()
    rows = metrics(gpu_run)
    assert [row["epoch"] for row in rows] == list(range(1, 11))
    assert all(math.isfinite(row["train_loss"]) and math.isfinite(row["val_loss"]) for row in rows)
    first, *later = [row[f"val_{task.BEST_METRIC}"] for row in rows]
    assert max(later) > first if task.BEST_MODE == "max" else min(later) < first


SLOW_STEPS = """

import time

import functools

_build_model = build_model


@functools.wraps(_build_model)  # the same parameters: the data description fills them as before
def build_model(num_classes, **options):  # noqa: F811 - a test slows every step, to stop part-way through an epoch
    model = _build_model(num_classes, **options)
    model.register_forward_pre_hook(lambda module, inputs: time.sleep(0.02))
    return model
"""


def test_sigterm_part_way_through_an_epoch_saves_and_the_same_command_finishes_every_epoch_once(project_root, tmp_path):
    project = copy_of_project(project_root, tmp_path / "project", model=SLOW_STEPS)
    output = tmp_path / "output"
    args = ["--output-dir", str(output), *data_args(output), "--epochs", "3", "--device", "gpu"]
    args += ["--batch-size", "16", "--log-every", "1"]
    job = subprocess.Popen(["bash", "run.sh", *args], cwd=project, env=environment(), start_new_session=True)
    log, deadline = output / "train.log", time.monotonic() + 300
    while not (log.exists() and "epoch 2 step 10/" in log.read_text()):
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before epoch 2 step 10"
        time.sleep(0.02)

    os.killpg(job.pid, signal.SIGTERM)  # every process, as SLURM's scancel does

    assert job.wait(timeout=120) == 143
    stopped_at = int(log.read_text().split("stopped by SIGTERM after epoch 2 step ")[1].split(";")[0])
    train(project, output, "--epochs", "3", "--device", "gpu", "--batch-size", "16")
    assert f"(epoch 2, step {stopped_at})" in log.read_text()
    assert [row["epoch"] for row in metrics(output)] == [1, 2, 3]


@READS_GPU_RUN
def test_a_gpu_checkpoint_resumes_and_evaluates_on_the_cpu_as_on_the_gpu(gpu_run, project_root, tmp_path):
    resumed = tmp_path / "output"
    shutil.copytree(gpu_run, resumed)

    train(project_root, resumed, "--epochs", "11", **CPU_ONLY)

    assert [row["epoch"] for row in metrics(resumed)] == list(range(1, 12))
    on_gpu = evaluate(project_root, gpu_run / "checkpoints" / CHECKPOINT, tmp_path / "gpu" / "output")
    on_cpu = evaluate(project_root, gpu_run / "checkpoints" / CHECKPOINT, tmp_path / "cpu" / "output", **CPU_ONLY)
    assert_same_metrics(on_gpu, on_cpu)


@READS_CPU_RUN
def test_a_cpu_checkpoint_resumes_with_mixed_precision_and_evaluates_on_the_gpu(cpu_run, project_root, tmp_path):
    resumed = tmp_path / "output"
    shutil.copytree(cpu_run, resumed)

    train(project_root, resumed, "--epochs", "3", "--device", "gpu", "--amp")  # the CPU saved no loss-scaler state

    assert [row["epoch"] for row in metrics(resumed)] == [1, 2, 3]
    on_cpu = evaluate(project_root, cpu_run / "checkpoints" / CHECKPOINT, tmp_path / "cpu" / "output", **CPU_ONLY)
    on_gpu = evaluate(project_root, cpu_run / "checkpoints" / CHECKPOINT, tmp_path / "gpu" / "output")
    assert_same_metrics(on_gpu, on_cpu)


@pytest.mark.parametrize(
    "source", [pytest.param("gpu_run", marks=READS_GPU_RUN), pytest.param("cpu_run", marks=READS_CPU_RUN)]
)
def test_init_from_a_checkpoint_of_the_other_device(source, request, project_root, tmp_path):
    env = CPU_ONLY if source == "gpu_run" else {}
    source = request.getfixturevalue(source)  # only the run this case reads
    output = tmp_path / "output"

    train(project_root, output, "--epochs", "1", "--init-from", str(source / "checkpoints" / LAST), **env)

    assert "initialised from" in (output / "train.log").read_text()


KERNEL_ASKS_FOR_THE_GPU = {
    "pytorch": "import torch\nassert torch.cuda.is_available()\n",
    "paddle": "import paddle\nassert paddle.device.cuda.device_count() > 0\n",
}[FRAMEWORK]
LAUNCH_FROM_THE_KERNEL = """
from {{ cookiecutter.project_slug }} import notebook
from {{ cookiecutter.project_slug }}.errors import UserError


def defined_in_a_cell(args):
    pass


try:
    notebook.launch([], nproc=1, train=defined_in_a_cell)
    print("cell function: ran")
except UserError as error:
    print("cell function: refused:", error)
notebook.launch({argv!r}, nproc=1)
print("run.py's training: done")
"""
TOUCH = {
    "is_available": "",
    "initialised": "torch.zeros(1, device='cuda')" if FRAMEWORK == "pytorch" else "paddle.zeros([1])",
}


@pytest.mark.parametrize("touch", TOUCH)
def test_launch_after_the_kernel_used_the_gpu_trains_or_refuses_in_one_line(touch, project_root, tmp_path):
    output = tmp_path / "output"
    argv = ["--epochs", "1", "--output-dir", str(output), *data_args(output)]
    script = KERNEL_ASKS_FOR_THE_GPU + TOUCH[touch] + LAUNCH_FROM_THE_KERNEL.format(argv=argv)

    result = subprocess.run(
        [sys.executable, "-c", script], cwd=project_root, env=environment(), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "cell function: ran" in result.stdout or "cell function: refused: launch() cannot start" in result.stdout
    assert "run.py's training: done" in result.stdout
    assert [row["epoch"] for row in metrics(output)] == [1]
    assert "Traceback" not in result.stderr


def test_more_processes_than_gpus_is_one_line_naming_both_numbers(project_root, tmp_path):
    gpus = framework_probe.gpu_count()

    result = train(project_root, tmp_path / "output", "--epochs", "1", nproc=gpus + 1, check=False)

    assert result.returncode == 1
    assert f"error: {gpus + 1} processes on this machine, but it has {gpus} visible GPU" in result.stderr
    assert not (tmp_path / "output").exists()


CPU_SAVE = {
    "pytorch": "import torch\nprint('cuda initialised:', torch.cuda.is_initialized())\n",
    "paddle": "import paddle\nstate = paddle.load({last!r})\nprint('gpu stream saved:', state['rng'][0]['gpu'] is not None)\n",
}[FRAMEWORK]


def test_a_cpu_run_on_a_gpu_machine_leaves_cuda_alone(project_root, tmp_path):
    output = tmp_path / "output"
    argv = ["--epochs", "1", "--device", "cpu", "--output-dir", str(output), *data_args(output)]
    script = f"from {{ cookiecutter.project_slug }} import notebook\nnotebook.train_here({argv!r})\n"
    script += CPU_SAVE.format(last=str(output / "checkpoints" / LAST.replace(".pdparams", ".pdopt")))

    result = subprocess.run(
        [sys.executable, "-c", script], cwd=project_root, env=environment(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    assert "cuda initialised: False" in result.stdout or "gpu stream saved: False" in result.stdout


@pytest.mark.gpu(2)
def test_two_ranks_train_with_nccl_one_gpu_each(project_root, tmp_path):
    output = tmp_path / "output"

    train(project_root, output, "--epochs", "2", "--device", "gpu", nproc=2)

    assert "2 process(es) on gpu" in (output / "train.log").read_text()
    assert [(row["epoch"], row["world_size"]) for row in metrics(output)] == [(1, 2), (2, 2)]


@pytest.mark.parametrize("dtype, words", [("bf16", "bfloat16 mixed precision"), ("fp16", "float16 mixed precision")])
def test_each_mixed_precision_dtype_trains_and_evaluates_on_the_gpu(dtype, words, project_root, tmp_path):
    output = tmp_path / "output"

    result = train(project_root, output, "--epochs", "1", "--device", "gpu", "--amp-dtype", dtype, check=False)

    if result.returncode == 0:
        assert words in (output / "train.log").read_text()
        assert [row["epoch"] for row in metrics(output)] == [1]
    else:  # a GPU older than compute capability 8.0 has no native bfloat16: one line says so
        assert dtype == "bf16" and "error: --amp-dtype bf16: this GPU" in result.stderr


def test_a_compiled_gpu_run_says_its_compile_time_and_resumes_without_compile(project_root, tmp_path):
    output = tmp_path / "output"

    train(project_root, output, "--epochs", "1", "--device", "gpu", "--compile")
    compiled_log = (output / "train.log").read_text()
    train(project_root, output, "--epochs", "2", "--device", "gpu")

    said = {"pytorch": "--compile: the first step took", "paddle": "--compile is PyTorch's"}[FRAMEWORK]
    assert compiled_log.count(said) == 1
    assert [row["epoch"] for row in metrics(output)] == [1, 2]


def test_two_deterministic_gpu_runs_train_the_same_losses(project_root, tmp_path):
    for name in ("first", "second"):
        train(project_root, tmp_path / name / "output", "--epochs", "2", "--device", "gpu", "--deterministic")

    first, second = (metrics(tmp_path / name / "output") for name in ("first", "second"))
    assert [row["train_loss"] for row in first] == [row["train_loss"] for row in second]


def test_a_gpu_run_that_waits_on_a_slow_disk_says_so_once(project_root, tmp_path):
    # A disk slow enough that reading outweighs the GPU's steps, whatever else shares the GPU (the tier's tests do).
    project = copy_of_project(project_root, tmp_path / "project", data=f"{SLOW_DATA}\nSAMPLE_READ_S = 0.008\n")
    output = tmp_path / "output"

    train(project, output, "--epochs", "1", "--device", "gpu", "--workers", "0")

    assert (output / "train.log").read_text().count("training waits for its data") == 1
    assert metrics(output)[0]["data_wait"] > 0.5


# Each framework's sharded strategies (README: Models larger than one GPU) as a user asks for them: (arguments, words
# train.log holds).
SHARDED_RUNS = {
    "pytorch": {
        "fsdp-bf16-recompute": (
            ("--strategy", "fsdp", "--amp", "--amp-dtype", "bf16", "--activation-checkpointing"),
            ("strategy fsdp: ", "bfloat16 mixed precision"),
        ),
    },
    "paddle": {
        f"sharding-stage{stage}": (("--strategy", "sharding", "--sharding-stage", str(stage)), ("strategy sharding",))
        for stage in (2, 3)
    },
}[FRAMEWORK]


def train_sharded(project: Path, output: Path, run: str, epochs: int, nproc: int = 1) -> str:
    """`--epochs epochs` of SHARDED_RUNS[run] on the GPU(s); its train.log. A GPU without native bfloat16 refuses
    --amp-dtype bf16 in one line: the test is then skipped, saying so."""
    args, _ = SHARDED_RUNS[run]
    result = train(project, output, "--epochs", str(epochs), "--device", "gpu", *args, nproc=nproc, check=False)
    if result.returncode != 0 and "error: --amp-dtype bf16: this GPU" in result.stderr:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (output / "train.log").read_text()


def assert_resumed_once(log: str, rows: list[dict], world_size: int) -> None:
    """The second run went on from the first one's epoch 1 and trained epoch 2 only: each epoch recorded once."""
    resumed = [line for line in log.splitlines() if "resumed from" in line]
    assert len(resumed) == 1 and resumed[0].endswith(" (epoch 1)"), log
    assert [(row["epoch"], row["world_size"]) for row in rows] == [(1, world_size), (2, world_size)]
    assert all(math.isfinite(row["train_loss"]) and math.isfinite(row["val_loss"]) for row in rows)


@pytest.mark.parametrize("run", SHARDED_RUNS)
def test_a_sharded_strategy_trains_on_one_gpu_and_the_same_command_resumes_it(run, project_root, tmp_path):
    output = tmp_path / "output"

    train_sharded(project_root, output, run, epochs=1)
    log = train_sharded(project_root, output, run, epochs=2)

    assert "1 process(es) on gpu" in log
    assert all(words in log for words in SHARDED_RUNS[run][1]), log
    assert_resumed_once(log, metrics(output), world_size=1)


@pytest.mark.gpu(2)
@pytest.mark.parametrize("run", SHARDED_RUNS)
def test_a_sharded_strategy_on_two_gpus_saves_folders_of_shards_and_resumes_from_last(run, project_root, tmp_path):
    output, checkpoints = tmp_path / "output", tmp_path / "output" / "checkpoints"

    log = train_sharded(project_root, output, run, epochs=1, nproc=2)

    assert "2 process(es) on gpu" in log
    assert all(words in log for words in SHARDED_RUNS[run][1]), log
    assert (checkpoints / "last").is_dir() and (checkpoints / "best").is_dir()
    assert not (checkpoints / LAST).exists() and not (checkpoints / CHECKPOINT).exists()  # no single files
    log = train_sharded(project_root, output, run, epochs=2, nproc=2)
    assert_resumed_once(log, metrics(output), world_size=2)
