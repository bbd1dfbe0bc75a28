"""Curves for TensorBoard or VisualDL: rank 0 only, one value per epoch, resumed runs continue the same curves; MLflow and
W&B missing (the runs they record are read back by test_config.py and the template's launcher matrix).

What each framework's writer left is read back with its own reader (curves.py beside this file).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from curves import CPU, WRITER_MODULE, curve

from {{ cookiecutter.project_slug }} import logs, notebook, settings, task, trackers, tracking, workspace
from {{ cookiecutter.project_slug }}.distributed import DistEnv
from {{ cookiecutter.project_slug }}.errors import UserError

RANK_0 = DistEnv(0, 0, 2, CPU)
RANK_1 = DistEnv(1, 1, 2, CPU)


def record(epoch: int, val_acc: float) -> dict:
    return {"epoch": epoch, "train_loss": 1.0 / epoch, "val_loss": 1.5 / epoch, "val_acc": val_acc, "world_size": 2}


def test_rank_0_writes_the_loss_at_its_steps_and_each_epoch_metric_once(tmp_path):
    tracker = tracking.Tracker(tmp_path, RANK_0)
    tracker.loss(5, 2.0)
    tracker.loss(10, 1.5)
    tracker.epoch(1, record(1, 0.5))
    assert curve(tmp_path, "epoch/val_acc") == [(1, 0.5)]  # on disk at each epoch's end
    tracker.loss(15, 1.0)
    tracker.epoch(2, record(2, 0.75))
    tracker.close()

    assert curve(tmp_path, "train/loss") == [(5, 2.0), (10, 1.5), (15, 1.0)]
    assert curve(tmp_path, "epoch/val_acc") == [(1, 0.5), (2, 0.75)]
    assert curve(tmp_path, "epoch/train_loss") == [(1, 1.0), (2, 0.5)]


def test_other_ranks_and_no_tracking_write_nothing(tmp_path):
    for tracker in (tracking.Tracker(tmp_path, RANK_1), tracking.Tracker(tmp_path, RANK_0, enabled=False)):
        tracker.loss(1, 1.0)
        tracker.epoch(1, record(1, 0.5))
        tracker.close()

    assert not list(tmp_path.iterdir())


def test_a_resumed_run_continues_the_curves_without_the_steps_trained_again(tmp_path):
    killed = tracking.Tracker(tmp_path, RANK_0)
    for step in range(1, 11):  # killed after step 10 of epoch 2; the checkpoint holds epoch 1 (steps 1-5)
        killed.loss(step, 10.0 - step)
        if step in (5, 10):
            killed.epoch(step // 5, record(step // 5, 0.1 * step))
    killed.close()

    resumed = tracking.Tracker(tmp_path, RANK_0, start_step=5, start_epoch=1)
    for step in range(6, 13):
        resumed.loss(step, 100.0 + step)
    resumed.epoch(2, record(2, 0.9))
    resumed.close()

    trained_before = [(step, 10.0 - step) for step in range(1, 6)]
    assert curve(tmp_path, "train/loss") == trained_before + [(step, 100.0 + step) for step in range(6, 13)]
    assert curve(tmp_path, "epoch/val_acc") == [(1, 0.5), (2, 0.9)]


@pytest.mark.parametrize("tracker, package", [(trackers.MLflow, "mlflow"), (trackers.Wandb, "wandb")])
def test_a_missing_experiment_tracker_is_one_error_naming_its_pip_install(tmp_path, monkeypatch, tracker, package):
    monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed

    with pytest.raises(UserError) as missing:
        tracker(tmp_path, RANK_0)

    assert f"pip install {package}" in str(missing.value)
    tracker(tmp_path, RANK_1)  # other ranks never need it


def test_a_missing_writer_package_is_one_error_naming_it_and_no_tracking(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, tracking.Tracker.PACKAGE, None)  # as if it were not installed

    with pytest.raises(UserError) as missing:
        tracking.Tracker(tmp_path, RANK_0)

    assert tracking.Tracker.PACKAGE in str(missing.value) and "--no-tracking" in str(missing.value)
    tracking.Tracker(tmp_path, RANK_1)  # other ranks never need it
    tracking.Tracker(tmp_path, RANK_0, enabled=False)


def test_the_writer_is_imported_on_rank_0_at_its_first_record_only(tmp_path, project_root):
    code = f"""
import dataclasses, sys
from {{ cookiecutter.project_slug }} import distributed, tracking
rank_0 = distributed.setup("cpu")  # one process, no launcher: rank 0 of 1
other = tracking.Tracker(sys.argv[1], dataclasses.replace(rank_0, rank=1))
other.loss(1, 1.0)
main = tracking.Tracker(sys.argv[1], rank_0)
print({WRITER_MODULE!r} in sys.modules)
main.loss(1, 1.0)
print({WRITER_MODULE!r} in sys.modules)
main.close()
"""
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=project_root, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "True"]


@pytest.mark.parametrize(
    "epoch, batch, batches, grad_accum, step",
    [(1, 0, 45, 1, 0), (1, 45, 45, 1, 45), (2, 10, 45, 1, 55), (1, 45, 45, 2, 23), (2, 4, 45, 2, 25)],
)
def test_optimizer_steps_count_on_across_epochs(epoch, batch, batches, grad_accum, step):
    assert logs.optimizer_step(epoch, batch, batches, grad_accum) == step


CELL = """
from {{ cookiecutter.project_slug }} import distributed, tracking


def track(args):
    env = distributed.setup("cpu", 60)
    try:
        tracker = tracking.Tracker(args.output_dir, env)
        tracker.loss(1, float(env.rank))
        tracker.epoch(1, {"epoch": 1, "val_acc": float(env.rank)})
        tracker.close()
        distributed.barrier()  # leave together, as run.py does: rank 0 hosts what the others still talk to
    finally:
        distributed.cleanup()
"""


@pytest.mark.slow
def test_of_two_ranks_only_rank_0_writes(tmp_path):
    namespace = {"__name__": "__main__"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)

    notebook.launch(["--output-dir", str(tmp_path), "--device", "cpu"], nproc=2, train=namespace["track"])

    assert curve(tmp_path, "train/loss") == [(1, 0.0)]
    assert curve(tmp_path, "epoch/val_acc") == [(1, 0.0)]


def train(project_root, output_dir, *args: str) -> list[dict]:
    """`python run.py --synthetic ARGS` in one process; the metrics.jsonl records."""
    command = [sys.executable, "run.py", "--synthetic", "--device", "cpu", "--output-dir", str(output_dir), *args]
    subprocess.run(command, cwd=project_root, capture_output=True, check=True, timeout=300)
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_training_records_each_epoch_once_and_a_resumed_run_continues_the_loss_curve(project_root, tmp_path):
    train(project_root, tmp_path, "--epochs", "2", "--log-every", "5")
    metrics = train(project_root, tmp_path, "--epochs", "3", "--log-every", "5")  # resumes after epoch 2

    best = f"val_{task.BEST_METRIC}"
    # Curves hold 32-bit floats: the metric as one, then rounded as curve() rounds.
    assert curve(tmp_path, f"epoch/{best}") == [(m["epoch"], round(float(np.float32(m[best])), 6)) for m in metrics]
    steps = [step for step, _ in curve(tmp_path, "train/loss")]
    assert steps == sorted(set(steps)) and len(steps) >= 3  # on from where the checkpoint was, none twice


@pytest.mark.slow
def test_no_tracking_trains_without_writing_curves(project_root, tmp_path):
    train(project_root, tmp_path, "--epochs", "1", "--no-tracking")

    assert not (tmp_path / tracking.Tracker.FOLDER).exists()


@pytest.mark.slow
def test_a_default_two_process_run_on_the_sample_draws_a_loss_curve_of_several_points_an_epoch(project_root, tmp_path):
    command = ["bash", "run.sh", "--epochs", "2", "--device", "cpu", "--output-dir", str(tmp_path)]
    if settings.DATASET == "zip":  # the sample, extracted outside the project
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env.update(NPROC_PER_NODE="2", PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])

    subprocess.run(command, cwd=project_root, env=env, capture_output=True, check=True, timeout=300)

    points = curve(tmp_path, "train/loss")
    assert len(points) >= 2 * 4 and [step for step, _ in points] == sorted({step for step, _ in points})
