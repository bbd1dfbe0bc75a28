"""Real runs of the image classification sample's own: a new head on other classes, and a checkpoint that records
the images' shape."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_image_folder

from {{ cookiecutter.project_slug }} import images, inference, settings, workspace
from {{ cookiecutter.project_slug }}.model import build_model

pytestmark = pytest.mark.slow

TIMEOUT_S = 600
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "SLURM_NTASKS")
# Grey images of 12 x 12 pixels: what the checkpoint must remember to read new images as it trained on them.
GREY_SMALL = ["--channels", "1", "--image-size", "12"]


def run_py(project_root: Path, *args: str) -> str:
    """`python run.py ARGS --device cpu` in one process; its output (stdout, then stderr)."""
    env = {name: value for name, value in os.environ.items() if name not in LAUNCHER_VARIABLES}
    result = subprocess.run(
        [sys.executable, "run.py", *args, "--device", "cpu"], cwd=project_root, env=env, capture_output=True,
        text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def read_metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ten_class_checkpoint(tmp_path_factory, project_root) -> Path:
    """The best checkpoint of one epoch on 10 classes of random grey images of 12 x 12 pixels."""
    output_dir = tmp_path_factory.mktemp("ten_classes") / "output"
    run_py(project_root, "--synthetic", *GREY_SMALL, "--epochs", "1", "--output-dir", str(output_dir))
    return inference.checkpoint_path(output_dir, "best")


def test_a_checkpoint_records_the_images_shape_so_predicting_needs_nothing_else(ten_class_checkpoint):
    data = inference.checkpoint_data(ten_class_checkpoint)
    model = inference.load_for_inference(ten_class_checkpoint, device="cpu")  # with 1 input channel, as trained

    assert data == {
        "classes": [str(label) for label in range(10)],
        "image_size": 12,
        "channels": 1,
        "mean": images.MEAN,
        "std": images.STD,
        "num_classes": 10,
    }
    rows = inference.predict(model, np.zeros((3, 1, 12, 12), dtype=np.float32))
    assert len(rows) == 3 and all(label in range(10) and 0 < chance <= 1 for label, chance in rows)


def test_init_from_a_checkpoint_of_ten_classes_fine_tunes_on_three_and_lists_the_head_it_left(
    ten_class_checkpoint, project_root, tmp_path
):
    data_dir = tmp_path / "three"
    for split, count in (("train", 12), ("val", 3)):
        write_image_folder(data_dir / split, ["cat", "cow", "dog"], per_class=count)
    output_dir = tmp_path / "output"
    args = ["--data-dir", str(data_dir), "--output-dir", str(output_dir), *GREY_SMALL]
    args += ["--init-from", str(ten_class_checkpoint)]

    started = run_py(project_root, *args, "--epochs", "1")
    resumed = run_py(project_root, *args, "--epochs", "2")

    [left] = [line for line in started.splitlines() if "left as build_model() made them" in line]
    assert "Skip loading" not in started  # (paddle's warning of each, besides that line)

    def shapes(model) -> dict:
        return {name: tuple(int(size) for size in value.shape) for name, value in model.state_dict().items()}

    saved = shapes(inference.load_for_inference(ten_class_checkpoint, device="cpu"))
    now = shapes(build_model(3, channels=1))
    head = [name for name in saved if saved[name] != now[name]]  # the classifier's: 10 classes, now 3
    assert head and left.split("): ", 1)[1] == ", ".join(
        f"{name} ({saved[name]} in the file, {now[name]} in the model)" for name in head
    )
    assert f"initialised from {ten_class_checkpoint}" in started
    assert f"--init-from {ten_class_checkpoint} ignored: a resumed run goes on from its own checkpoint" in resumed
    assert [record["epoch"] for record in read_metrics(output_dir)] == [1, 2]


@pytest.mark.gpu
def test_ten_epochs_with_mixed_precision_on_a_gpu_reach_the_samples_accuracy(project_root, tmp_path):
    output_dir = tmp_path / "output"
    args = ["--epochs", "10", "--device", "gpu", "--amp", "--output-dir", str(output_dir)]
    if settings.DATASET == "zip":  # extracted into the test's own folder, not the project's data/
        args += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(tmp_path / "data")]
    env = {name: value for name, value in os.environ.items() if name not in LAUNCHER_VARIABLES}
    env.update(NPROC_PER_NODE="1", PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))

    result = subprocess.run(
        ["bash", "run.sh", *args], cwd=project_root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = read_metrics(output_dir)
    assert [row["epoch"] for row in rows] == list(range(1, 11))
    if settings.DATASET != "synthetic":  # the sample's digits; random images reach less
        assert max(row["val_acc"] for row in rows) >= 0.9
