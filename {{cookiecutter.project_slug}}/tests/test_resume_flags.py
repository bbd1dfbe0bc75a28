"""A resumed run keeps what its checkpoint remembers; a flag given on the resume's command line wins, and says so."""

import json
import os
import subprocess
import sys

import pytest

from {{ cookiecutter.project_slug }} import cli, settings, workspace

pytestmark = pytest.mark.slow


def run_py(project_root, output, *args: str) -> str:
    command = [sys.executable, "run.py", "--device", "cpu", "--output-dir", str(output), *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NPROC_PER_NODE")}
    result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def rates(output) -> list[float]:
    return [round(json.loads(line)["lr"], 6) for line in (output / "metrics.jsonl").read_text().splitlines()]


def test_a_resume_without_lr_goes_on_with_the_rate_the_run_was_started_with(project_root, tmp_path):
    output = tmp_path / "output"
    run_py(project_root, output, "--epochs", "2", "--lr", "0.02")

    run_py(project_root, output, "--epochs", "4")

    # Epochs 1-2 on the cosine of 2 epochs, 3-4 on that of 4, both from 0.02 (not from the default rate).
    assert rates(output) == [0.02, 0.01, 0.01, round(0.01 * (1 - 2**-0.5), 6)]


def test_a_rate_given_on_resume_applies_from_there_on_and_the_log_says_so(project_root, tmp_path):
    output = tmp_path / "output"
    run_py(project_root, output, "--epochs", "2")  # at the default rate

    log = run_py(project_root, output, "--epochs", "4", "--lr", "0.001")

    assert rates(output)[:2] == [cli.DEFAULT_LR, cli.DEFAULT_LR / 2]
    assert rates(output)[2] == 0.001  # epoch 3 trains at the given rate
    assert 0 < rates(output)[3] < 0.001  # and the schedule goes on from it
    assert "--lr 0.001: the resumed run trains at it from epoch 3 on" in log
