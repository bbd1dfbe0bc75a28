"""Real training runs on CPU: two processes through run.sh, and one through plain python run.py.

Framework- and task-neutral: what differs between frameworks (checkpoint file names, the
dataset) is read from the project's settings, what differs between tasks (the data's size,
the best metric, the network's arguments) from data.py, task.py and model.py.
"""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import batches_per_epoch, copy_of_project, default_data_sizes

from {{ cookiecutter.project_slug }} import checkpoint, cli, data, inference, seam, settings, task, workspace

pytestmark = pytest.mark.slow

TIMEOUT_S = 600
METRIC_KEYS = {
    "epoch",
    "train_loss",
    "val_loss",
    f"val_{task.BEST_METRIC}",
    "world_size",
    "global_batch_size",
    "train_samples",
    "val_samples",
    "epoch_time_s",
    "data_wait",
}
CHECKPOINT_FILES = {
    "pytorch": {"last.pt", "best.pt"},
    "paddle": {"last.pdparams", "last.pdopt", "best.pdparams"},
}[settings.FRAMEWORK]
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "SLURM_NTASKS")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def expected_sizes(tmp_path_factory) -> tuple[int, int]:
    """(training samples, validation samples) of the data this project trains on by default: data.py's datasets."""
    return default_data_sizes(tmp_path_factory.mktemp("sample") / settings.SAMPLE)


def run(command: list[str], project_root: Path, nproc: int, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(
        NPROC_PER_NODE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
    )
    result = subprocess.run(
        command, cwd=project_root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert result.returncode == 0 or not check, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def training_args(output_dir: Path, epochs: int) -> list[str]:
    args = ["--epochs", str(epochs), "--output-dir", str(output_dir), "--device", "cpu"]
    if settings.DATASET == "zip":
        # Extract into the test's own folder, not the project's data/.
        args += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output_dir.parent / "data")]
    return args


def read_metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, project_root) -> Path:
    """`NPROC_PER_NODE=2 bash run.sh --epochs 2`; its output folder."""
    output_dir = tmp_path_factory.mktemp("two_processes") / "output"
    run(["bash", "run.sh", *training_args(output_dir, epochs=2)], project_root, nproc=2)
    return output_dir


def test_two_processes_log_one_metrics_line_per_epoch_over_the_whole_dataset(
    two_process_run, project_root, expected_sizes
):
    train_size, val_size = expected_sizes
    batch_size = cli.parse_args([]).batch_size

    metrics = read_metrics(two_process_run)

    assert [record["epoch"] for record in metrics] == [1, 2]
    for record in metrics:
        assert METRIC_KEYS <= record.keys()
        assert record["world_size"] == 2
        assert record["global_batch_size"] == 2 * batch_size
        assert record["train_samples"] == train_size  # not twice it, and no padded repeats
        assert record["val_samples"] == val_size  # every validation sample exactly once


def test_two_processes_write_checkpoints_logs_and_metrics_from_rank_0_only(two_process_run):
    # Each output exists once, where rank 0 puts it (a launcher may keep its own logs beside them).
    outputs = sorted(p.relative_to(two_process_run).as_posix() for p in two_process_run.rglob("*") if p.is_file())
    expected = {"metrics.jsonl": "metrics.jsonl", "train.log": "train.log"}
    expected |= {name: f"checkpoints/{name}" for name in CHECKPOINT_FILES}
    for name, where in expected.items():
        assert [path for path in outputs if Path(path).name == name] == [where]
    assert (two_process_run / "train.log").read_text().strip()
    # The other rank logs to its own file only.
    assert sorted(p.name for p in (two_process_run / "logs").iterdir()) == ["rank1.log"]
    checkpoints = [p.name for p in (two_process_run / "checkpoints").iterdir()]
    assert not [name for name in checkpoints if name.startswith(".")], "a temporary checkpoint file was left"


def test_second_run_with_more_epochs_resumes_and_adds_only_the_new_epoch(two_process_run, project_root, tmp_path):
    output_dir = tmp_path / "output"
    shutil.copytree(two_process_run, output_dir)
    before = (output_dir / "metrics.jsonl").read_text().splitlines()

    run(["bash", "run.sh", *training_args(output_dir, epochs=3)], project_root, nproc=2)

    after = (output_dir / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == before  # epochs 1 and 2 are neither trained nor logged again
    assert [record["epoch"] for record in read_metrics(output_dir)] == [1, 2, 3]
    assert read_metrics(output_dir)[2]["world_size"] == 2


POISONED_MODEL = """

import functools

_build_model = build_model


@functools.wraps(_build_model)  # the same parameters: the data description fills them as before
def build_model(num_classes, **options):
    \"\"\"The network, its output NaN from training batch {poisoned} on (a step of epoch 2).\"\"\"
    network = _build_model(num_classes, **options)
    batches = [0]

    def poison(layer, inputs, output):
        batches[0] += layer.training
        factor = float("nan") if batches[0] >= {poisoned} else 1.0
        # (a regression model given targets answers with two tensors: its errors)
        return tuple(part * factor for part in output) if isinstance(output, tuple) else output * factor

    # A forward hook: torch's register_forward_hook, paddle's register_forward_post_hook.
    register = getattr(network, "register_forward_post_hook", None) or network.register_forward_hook
    register(poison)
    return network
"""


def test_a_diverging_loss_stops_every_rank_with_one_error_line_and_keeps_the_last_good_checkpoint(
    project_root, tmp_path, expected_sizes
):
    epoch_1 = batches_per_epoch(expected_sizes[0], nproc=2)
    poisoned = epoch_1 + min(8, epoch_1)  # the 8th step of epoch 2, or its last
    project = copy_of_project(project_root, tmp_path / "project", model=POISONED_MODEL.format(poisoned=poisoned))
    output_dir = tmp_path / "output"

    result = run(["bash", "run.sh", *training_args(output_dir, epochs=3)], project, nproc=2, check=False)

    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # Rank 0 alone says it (paddle's launch shows worker 0's last lines again, torchrun adds whichever rank it
    # saw stop first; every rank stops with status 1): in epoch 2, which is neither saved nor logged.
    [diverged] = {line for line in errors if "NaN or infinite" in line}
    assert "in epoch 2 by step" in diverged and "--lr" in diverged
    assert all(line == diverged or re.match(r"error: rank \d stopped with status 1 ", line) for line in errors), errors
    assert [record["epoch"] for record in read_metrics(output_dir)] == [1]
    # Epoch 1's checkpoint is intact: the model as it was then trains on from it.
    run(["bash", "run.sh", *training_args(output_dir, epochs=2)], project_root, nproc=2)
    assert [record["epoch"] for record in read_metrics(output_dir)] == [1, 2]
    assert math.isfinite(read_metrics(output_dir)[1]["train_loss"])


SHIFTED_TASK = """

_training_loss, _metrics = training_loss, metrics
BEST_METRIC, BEST_MODE = "shifted", "min"


def training_loss(model, batch):  # noqa: F811 - a test changes the task as a user would
    return _training_loss(model, batch) + 10.0


def metrics(sums, per_sample, count):  # noqa: F811
    own = _metrics(sums, per_sample, count)
    return {**own, "shifted": own["loss"] + 10.0}
"""


def test_a_task_of_your_own_in_task_py_is_what_training_evaluation_and_the_best_checkpoint_use(project_root, tmp_path):
    project = copy_of_project(project_root, tmp_path / "project", task=SHIFTED_TASK)
    output_dir = tmp_path / "output"

    result = run(
        [sys.executable, "run.py", "--synthetic", "--epochs", "1", "--output-dir", str(output_dir)], project, nproc=1
    )

    [epoch] = read_metrics(output_dir)
    assert epoch["train_loss"] >= 10.0  # the task's loss is never negative: the shifted one trained
    assert epoch["val_shifted"] == pytest.approx(epoch["val_loss"] + 10.0)
    assert f"done: best val_shifted {epoch['val_shifted']:.4f}; checkpoint: " in result.stdout


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory, project_root) -> Path:
    """`python run.py --synthetic --epochs 1`: one epoch on random data of the task's shapes; its output folder."""
    output_dir = tmp_path_factory.mktemp("synthetic") / "output"
    args = ["--synthetic", "--epochs", "1", "--device", "cpu", "--output-dir", str(output_dir)]
    run([sys.executable, "run.py", *args], project_root, nproc=1)
    return output_dir


def test_evaluate_without_a_checkpoint_is_one_error_line_and_writes_nothing_in_the_folder(project_root, tmp_path):
    mistyped = tmp_path / "ouptut"

    result = run(["bash", "run.sh", "--evaluate", *training_args(mistyped, epochs=1)], project_root, 2, check=False)

    errors = {line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")}
    [said] = {line for line in errors if "--evaluate" in line}
    assert result.returncode == 1
    assert said.startswith(f"error: --evaluate: no checkpoint in {mistyped / 'checkpoints'}: pass --resume PATH")
    assert all(line == said or re.match(r"error: rank \d stopped with status 1 ", line) for line in errors), errors
    # (Paddle's run.sh makes the launcher's log folder there before run.py starts: its workers' logs are kept.)
    assert not mistyped.exists() or [path.name for path in mistyped.iterdir()] == ["launch-logs"]


def test_a_mistake_at_the_top_of_task_py_is_its_line_and_one_error_line_naming_the_file(project_root, tmp_path):
    project = copy_of_project(project_root, tmp_path / "project", task="\nLOSS = nn.MSELoss()  # (nn never imported)\n")

    result = run(["bash", "run.sh", *training_args(tmp_path / "output", epochs=1)], project, 2, check=False)

    said = result.stdout + result.stderr
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert result.returncode == 1
    assert errors == ["error: importing task.py raised NameError: name 'nn' is not defined"], said
    assert "    LOSS = nn.MSELoss()" in said and "Traceback" not in said


def test_init_from_a_checkpoint_of_the_same_network_loads_every_tensor_and_a_resumed_run_ignores_it(
    synthetic_run, project_root, tmp_path
):
    trained = inference.checkpoint_path(synthetic_run, "best")
    output_dir = tmp_path / "output"
    args = ["--synthetic", "--output-dir", str(output_dir), "--init-from", str(trained), "--device", "cpu"]
    tensors = len(inference.load_for_inference(trained, device="cpu").state_dict())

    started = run([sys.executable, "run.py", *args, "--epochs", "1"], project_root, nproc=1)
    resumed = run([sys.executable, "run.py", *args, "--epochs", "2"], project_root, nproc=1)

    assert f"initialised from {trained}: {tensors} of the model's {tensors} tensors" in started.stdout
    assert "left as build_model() made them" not in started.stdout
    assert f"--init-from {trained} ignored: a resumed run goes on from its own checkpoint" in resumed.stdout
    assert [record["epoch"] for record in read_metrics(output_dir)] == [1, 2]


def test_a_checkpoint_records_its_data_so_predicting_needs_nothing_else(synthetic_run):
    best = inference.checkpoint_path(synthetic_run, "best")
    train_set, _, num_classes = data.build_datasets(cli.parse_args(["--synthetic"]))

    recorded = inference.checkpoint_data(best)
    model = inference.load_for_inference(best, device="cpu")  # built from what the checkpoint records alone

    assert recorded == seam.data_description(train_set, num_classes)  # what the data described, and the outputs
    assert json.loads(json.dumps(recorded)) == recorded  # as plain lists, numbers and strings
    weights, _ = checkpoint.read_weights(best)
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(weights)
    assert all(np.array_equal(np.asarray(loaded[name]), np.asarray(weights[name])) for name in weights)


@pytest.mark.parametrize("where", ["a folder", "the checkpoint", "under a file"])
def test_export_where_it_cannot_write_is_one_line_and_loses_nothing(synthetic_run, project_root, tmp_path, where):
    best = inference.checkpoint_path(synthetic_run, "best")
    (tmp_path / "a-file").write_text("kept")
    output, said = {
        "a folder": (tmp_path, f"error: {tmp_path} is a folder: name the file to write in it"),
        "the checkpoint": (best, f"error: {best} is the checkpoint read: writing there would replace it; name another"),
        "under a file": (tmp_path / "a-file" / "model", f"error: {tmp_path / 'a-file' / 'model'} cannot be written ("),
    }[where]
    before = best.read_bytes()

    result = run([sys.executable, "export.py", str(best), str(output)], project_root, nproc=1, check=False)

    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith(said) and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]
    assert best.read_bytes() == before


def test_plain_python_run_trains_in_one_process(project_root, tmp_path, expected_sizes):
    output_dir = tmp_path / "output"
    train_size, val_size = expected_sizes

    run([sys.executable, "run.py", *training_args(output_dir, epochs=1)], project_root, nproc=1)

    (record,) = read_metrics(output_dir)
    assert record["epoch"] == 1
    assert record["world_size"] == 1
    assert record["global_batch_size"] == cli.parse_args([]).batch_size
    assert record["train_samples"] == train_size
    assert record["val_samples"] == val_size
    assert CHECKPOINT_FILES <= {p.name for p in (output_dir / "checkpoints").iterdir()}
    assert not (output_dir / "logs").exists()  # there are no other ranks to log
