"""Waits longer than paddle's 30-second gloo limit: a rank held back in extraction or in a save is waited for
up to --dist-timeout, and past it the job ends in one line."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from {{ cookiecutter.project_slug }} import settings, workspace

pytestmark = pytest.mark.slow

HELD_BACK_S = 45  # over paddle's gloo limit

SLOW_EXTRACTION = """

import os as _os
import time as _time

_prepare_dataset = prepare_dataset


def prepare_dataset(*args, **kwargs):  # noqa: F811 - a test holds rank 0 back, as a slow extraction would
    _prepare_dataset(*args, **kwargs)
    if _os.environ.get("PADDLE_TRAINER_ID") == "0":
        _time.sleep({seconds})
"""

SLOW_FIRST_SAVE = """

import time as _time

_write = Checkpointer._write


def _slow_first_write(self, training, is_best):  # a test makes the first save slow, as a network disk would
    if training["epoch"] == 1:
        _time.sleep({seconds})
    _write(self, training, is_best)


Checkpointer._write = _slow_first_write
"""


@pytest.fixture
def slow_project(project_root, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(project_root, project, ignore=shutil.ignore_patterns("output", "__pycache__"))
    return project


def hold_back(project, module: str, code: str, seconds: float) -> None:
    with open(project / "{{ cookiecutter.project_slug }}" / module, "a", encoding="utf-8") as file:
        file.write(code.format(seconds=seconds))


def train(project, output, *args: str) -> subprocess.CompletedProcess:
    command = ["bash", "run.sh", "--epochs", "2", "--device", "cpu", "--output-dir", str(output), *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    env.update(NPROC_PER_NODE="2", PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)


def test_a_rank_held_back_45_s_in_extraction_and_in_a_save_is_waited_for_up_to_the_dist_timeout(slow_project, tmp_path):
    hold_back(slow_project, "archive.py", SLOW_EXTRACTION, HELD_BACK_S)
    hold_back(slow_project, "checkpoint.py", SLOW_FIRST_SAVE, HELD_BACK_S)
    output = tmp_path / "output"
    started = time.monotonic()

    result = train(slow_project, output, "--dist-timeout", "120")

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert time.monotonic() - started > 2 * HELD_BACK_S
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]


def test_a_save_longer_than_the_dist_timeout_ends_the_job_in_one_line_that_names_the_wait(slow_project, tmp_path):
    hold_back(slow_project, "checkpoint.py", SLOW_FIRST_SAVE, 20)

    result = train(slow_project, tmp_path / "output", "--dist-timeout", "5")

    assert result.returncode != 0
    errors = {line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")}
    assert errors == {
        "error: waited --dist-timeout 5 s for rank 0's checkpoint save: raise --dist-timeout if that takes longer "
        "(paddle's own collectives on CPUs still give up after 30 s)"
    }, result.stdout[-2000:] + result.stderr[-2000:]
