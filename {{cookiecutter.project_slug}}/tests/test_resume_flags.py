"""A resumed run keeps what its checkpoint remembers; a flag given on the resume's command line wins, and says so."""

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import copy_of_project

from {{ cookiecutter.project_slug }} import cli, inference, settings, workspace
from {{ cookiecutter.project_slug }}.model import build_optimizer

pytestmark = pytest.mark.slow


def started(project_root, output, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "run.py", "--device", "cpu", "--output-dir", str(output), *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NPROC_PER_NODE")}
    return subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=300)


def run_py(project_root, output, *args: str) -> str:
    result = started(project_root, output, *args)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


# Appended to data.py: the training set's description names the data's release, DATA_RELEASE (a dataset replaced
# between a run and its resume).
RELEASED_DATA = """

import os

_build_released = build_datasets


def build_datasets(args):  # noqa: F811 - a test names the data's release
    train_set, val_set, outputs = _build_released(args)
    train_set.description = {**getattr(train_set, "description", {}), "release": os.environ["DATA_RELEASE"]}
    return train_set, val_set, outputs
"""


def rates(output) -> list[float]:
    return [round(json.loads(line)["lr"], 6) for line in (output / "metrics.jsonl").read_text().splitlines()]


def optimizer_rate(output, lr: float) -> float:
    """The rate model.py's build_optimizer() gives the run's network for --lr `lr` (the --lr itself, or the share
    of it that the task's optimizer takes)."""
    model = inference.load_for_inference(inference.checkpoint_path(output, "last"), device="cpu")
    optimizer = build_optimizer(model, lr)
    return optimizer.param_groups[0]["lr"] if settings.FRAMEWORK == "pytorch" else optimizer.get_lr()


def test_a_resume_without_lr_or_from_its_config_yaml_goes_on_with_the_rate_the_run_was_started_with(
    project_root, tmp_path
):
    output = tmp_path / "output"
    run_py(project_root, output, "--epochs", "2", "--lr", "0.02")

    log = run_py(project_root, output, "--config", str(output / "config.yaml"), "--epochs", "4")  # its lr: 0.02
    run_py(project_root, output, "--epochs", "5")

    # Epochs 1-2 on the cosine of 2 epochs, 3-4 on that of 4, 5 on that of 5, all from --lr 0.02's rate (not the
    # file's 0.02 started again at epoch 3, nor the default's).
    rate = optimizer_rate(output, 0.02)
    factors = (1, 0.5, 0.5, 0.5 * (1 - 2**-0.5), 0.5 * (1 + math.cos(math.pi * 4 / 5)))
    assert rates(output) == [round(rate * factor, 6) for factor in factors]
    assert "the resumed run trains at it" not in log and "epochs 2 -> 4" in log
    assert "lr: 0.02" in (output / "config.yaml").read_text()  # what the resume without --lr kept training at


def test_a_rate_given_on_resume_applies_from_there_on_and_the_log_says_so(project_root, tmp_path):
    output = tmp_path / "output"
    run_py(project_root, output, "--epochs", "2")  # at the default rate

    log = run_py(project_root, output, "--epochs", "4", "--lr", "0.001")

    default_rate = optimizer_rate(output, cli.DEFAULT_LR)
    assert rates(output)[:2] == [round(default_rate, 6), round(default_rate / 2, 6)]
    assert rates(output)[2] == round(optimizer_rate(output, 0.001), 6)  # the given rate, as a run started at it has
    assert 0 < rates(output)[3] < rates(output)[2]  # and the schedule goes on from it
    assert "--lr 0.001: the resumed run trains at it from epoch 3 on" in log


def test_a_rate_given_again_after_a_start_that_saved_nothing_is_still_the_new_rate(project_root, tmp_path):
    output = tmp_path / "output"
    run_py(project_root, output, "--epochs", "1")
    checkpoint = inference.checkpoint_path(output, "last").read_bytes()

    # A rate too large for the network: the loss diverges before the epoch ends, so nothing is saved, twice.
    for _ in range(2):
        diverged = started(project_root, output, "--epochs", "2", "--lr", "1e30", "--log-every", "1")
        assert diverged.returncode == 1, diverged.stdout[-2000:] + diverged.stderr[-2000:]
        assert "--lr 1e+30: the resumed run trains at it from epoch 2 on" in diverged.stdout, diverged.stdout[-2000:]
        assert "became NaN or infinite" in diverged.stderr
    assert inference.checkpoint_path(output, "last").read_bytes() == checkpoint
    run_py(project_root, output, "--epochs", "2")  # at the checkpoint's rate, and config.yaml says so, not 1e30's
    assert "lr: null" in (output / "config.yaml").read_text()


def test_a_warmup_rises_from_zero_a_resume_keeps_it_and_a_new_one_given_wins(project_root, tmp_path):
    output = tmp_path / "output"
    run_py(project_root, output, "--epochs", "1", "--warmup-epochs", "2")

    run_py(project_root, output, "--epochs", "3")  # the warmup of 2 epochs goes on
    log = run_py(project_root, output, "--epochs", "4", "--warmup-epochs", "0")

    rate = optimizer_rate(output, cli.DEFAULT_LR)
    # Each epoch's first rate: epoch 1 at 0, epoch 2 half-way up the warmup, epoch 3 at the full rate (the warmup
    # over, the cosine starts), epoch 4 on the 4-epoch cosine without a warmup.
    expected = [0, 0.5, 1, 0.5 * (1 + math.cos(math.pi * 3 / 4))]
    assert rates(output) == [round(rate * factor, 6) for factor in expected]
    assert "--warmup-epochs 0 replaces the resumed run's 2" in log


def test_a_resume_on_data_described_otherwise_than_its_checkpoint_says_what_differs(
    project_root, tmp_path, monkeypatch
):
    project = copy_of_project(project_root, tmp_path / "project", data=RELEASED_DATA)
    output = tmp_path / "output"
    monkeypatch.setenv("DATA_RELEASE", "1")
    run_py(project, output, "--epochs", "1")

    monkeypatch.setenv("DATA_RELEASE", "2")
    on_other_data = run_py(project, output, "--epochs", "2")
    on_the_same_data = run_py(project, output, "--epochs", "3")

    assert "the data differs from the checkpoint's in release: " in on_other_data
    assert "the data differs" not in on_the_same_data
    assert len((output / "metrics.jsonl").read_text().splitlines()) == 3  # training went on
