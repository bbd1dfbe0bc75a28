"""Shared fixtures of the project's tests, and the GPU tier's one condition."""

import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# Appended to data.py by tests of a slow disk: every training sample takes SAMPLE_READ_S seconds to read (a test that
# needs a slower disk sets it again below this code).
SLOW_DATA = """

import time

SAMPLE_READ_S = 0.004  # a network disk
_build_datasets = build_datasets


class _Slow:
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        time.sleep(SAMPLE_READ_S)
        return self.dataset[index]

    def __getattr__(self, name):  # the dataset's own attributes (its collate, its description) stay in reach
        if name == "dataset":  # not set yet (a copy being made): no attribute, rather than endless lookups
            raise AttributeError(name)
        return getattr(self.dataset, name)


def build_datasets(args):  # noqa: F811 - a test slows the reads, as a slow disk would
    train_set, val_set, num_classes = _build_datasets(args)
    return _Slow(train_set), val_set, num_classes
"""


# What archives made on macOS and Windows hold beside the data: never extracted, never read as data.
ARCHIVE_JUNK = {
    "__MACOSX/train/cat/._0.png": b"\x00\x05\x16\x07 AppleDouble",
    "__MACOSX/._train": b"\x00\x05\x16\x07",
    "train/cat/._0.png": b"\x00\x05\x16\x07 a resource fork, not a png",
    "train/.DS_Store": b"Bud1",
    "val/dog/Thumbs.db": b"\xd0\xcf\x11\xe0",
    ".DS_Store": b"Bud1",
}


def usable_gpus() -> tuple[int, str]:
    """(GPUs the framework can use, why none where there are none), asked without initialising CUDA here."""
    from {{ cookiecutter.project_slug }} import framework_probe

    count = framework_probe.gpu_count()
    return count, "" if count else (framework_probe.gpu_problem() or "no GPU here")


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu (or gpu(N): N GPUs) run where the framework can use that many GPUs, and are skipped,
    saying why, elsewhere."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    count, why = usable_gpus()
    for item in gpu_tests:
        needed = (item.get_closest_marker("gpu").args or (1,))[0]
        if count < needed:
            reason = f"the GPU tier needs {needed} usable GPU(s), this machine has {count}"
            reason += f": {why}" if why else ""
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def project_root() -> Path:
    """The baked project's folder, holding run.py and run.sh."""
    return ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_sh(project_root: Path, output: Path, *args: str) -> str:
    """`NPROC_PER_NODE=2 bash run.sh --device cpu --output-dir OUTPUT ARGS` (on the sample, extracted beside OUTPUT
    in a dataset=zip project), which must succeed; its console output."""
    from {{ cookiecutter.project_slug }} import settings, workspace

    command = ["--device", "cpu", "--output-dir", str(output), *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    return run_bash(project_root, "run.sh", *command)


def run_bash(project_root: Path, script: str, *args: str, nproc: int = 2) -> str:
    """`NPROC_PER_NODE=nproc bash SCRIPT ARGS` in the project (run.sh, predict.sh), which must succeed; its console
    output."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env.update(NPROC_PER_NODE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    command = ["bash", script, *args]
    result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="session")
def three_folds(tmp_path_factory, project_root) -> tuple[Path, str]:
    """`NPROC_PER_NODE=2 bash run.sh --folds 3 --epochs 2` (every fold, then the CV score): its output folder and
    console output."""
    output = tmp_path_factory.mktemp("folds") / "output"
    return output, run_sh(project_root, output, "--folds", "3", "--epochs", "2")


@pytest.fixture(scope="session")
def averaged_run(tmp_path_factory, project_root) -> Path:
    """2 epochs of --ema 0.9 on 2 processes, uninterrupted, each epoch's save kept (--keep-best 2): its output."""
    output = tmp_path_factory.mktemp("averaged") / "output"
    run_sh(project_root, output, "--epochs", "2", "--ema", "0.9", "--keep-best", "2")
    return output


def default_data_sizes(folder: Path) -> tuple[int, int]:
    """(training samples, validation samples) of the data the project trains on by default, as data.py reads it
    (a dataset=zip project's sample extracted into `folder`, not into the project's data/)."""
    from {{ cookiecutter.project_slug }} import archive, cli, data, settings, workspace

    args = []
    if settings.DATASET == "zip":
        archive.ensure_extracted(workspace.SAMPLE_ARCHIVE, folder, show_progress=False)
        args = ["--data-dir", str(folder)]
    train_set, val_set, _ = data.build_datasets(cli.parse_args(args))
    return len(train_set), len(val_set)


def batches_per_epoch(train_size: int, nproc: int) -> int:
    """The training batches each of `nproc` processes takes in an epoch at the default --batch-size (shards padded
    to equal sizes)."""
    from {{ cookiecutter.project_slug }} import cli

    return math.ceil(math.ceil(train_size / nproc) / cli.parse_args([]).batch_size)


def copy_of_project(project_root: Path, folder: Path, ignore: tuple[str, ...] = (), **appended: str) -> Path:
    """A copy of the project in `folder`, without its output, caches and the names in `ignore`, with code appended
    to modules of its package: `copy_of_project(root, folder, model=CODE)` ends model.py with CODE."""
    shutil.copytree(project_root, folder, ignore=shutil.ignore_patterns("output", "__pycache__", *ignore))
    for module, code in appended.items():
        with open(folder / "{{ cookiecutter.project_slug }}" / f"{module}.py", "a", encoding="utf-8") as file:
            file.write(code)
    return folder


# The checkpoint tests' runs pick best.* by an accuracy: (metric, mode), as a task names them.
ACC = ("acc", "max")


def acc_state(*args, **kwargs):
    """TrainingState(*args, **kwargs) of a run that picks best.* by the highest accuracy."""
    from {{ cookiecutter.project_slug }}.state import TrainingState

    best_metric, best_mode = ACC
    return TrainingState(*args, best_metric=best_metric, best_mode=best_mode, **kwargs)


def save_epoch(saver, epoch: int, best_acc: float, is_best: bool) -> None:
    """Save as run.py ends epoch `epoch`: the best accuracy is then `best_acc`, reached by this epoch or not."""
    saver.state = acc_state(epoch - 1, None if is_best else best_acc)
    saver.end_epoch(epoch, {"loss": 1.0, "acc": best_acc if is_best else 0.0})


def averaging(saver, decay: float | None = 0.9):
    """`saver` (a Checkpointer) of a run of --ema `decay` (None: a run without the flag), started as resume() starts
    it."""
    from {{ cookiecutter.project_slug }} import engine

    saver.ema = engine.Ema(saver.model, decay)
    return saver


def save_rank_result(folder: str | Path, rank: int, result: dict) -> None:
    """A spawned rank's training result (numpy arrays and numbers: its parameters, per-epoch losses and samples,
    ...) in folder/rank<rank>.npz, for the test that started it to read with rank_results()."""
    import numpy as np

    path = Path(folder) / f"rank{rank}.npz"
    np.savez(path, *result["parameters"], **{name: value for name, value in result.items() if name != "parameters"})


def rank_results(folder: Path, world_size: int) -> list[dict]:
    """What save_rank_result() wrote in folder for each of ranks 0 to world_size - 1."""
    import numpy as np

    results = []
    for rank in range(world_size):
        with np.load(folder / f"rank{rank}.npz") as saved:
            named = {name: saved[name] for name in saved.files if not name.startswith("arr_")}
            results.append({"parameters": [saved[f"arr_{i}"] for i in range(len(saved.files) - len(named))], **named})
    return results


def assert_trained_alike(result: dict, reference: dict, epoch_samples: list[int], rtol: float, atol: float) -> None:
    """Two trainings' results (save_rank_result()'s parameters and per-epoch losses and samples) alike: the same
    parameters and losses to rtol and atol, and `result`'s epochs over `epoch_samples` samples, one number an epoch."""
    import numpy as np

    for got, expected in zip(result["parameters"], reference["parameters"], strict=True):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    np.testing.assert_allclose(result["losses"], reference["losses"], rtol=rtol, atol=atol)
    assert list(result["samples"]) == epoch_samples


def assert_really_trained(result: dict, initial: list) -> None:
    """A training's result moved every parameter away from `initial` (numpy arrays) and lowered the loss from its
    first epoch to its second."""
    import numpy as np

    for trained, start in zip(result["parameters"], initial, strict=True):
        assert not np.allclose(trained, start, atol=1e-3)
    assert result["losses"][1] < result["losses"][0]


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    """path: a CSV table of `header` and `rows`, as a task's data folder holds one."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_image_folder(
    root: Path, classes: list[str], per_class: int, size: int = 8, seed: int = 0, first: int = 0
) -> Path:
    """root/<class>/<class>-<n>.png, n from `first`: small random grey images, `per_class` of each class."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, (size, size), dtype=np.uint8)
            Image.fromarray(pixels, mode="L").save(root / name / f"{name}-{first + index:03d}.png")
    return root
