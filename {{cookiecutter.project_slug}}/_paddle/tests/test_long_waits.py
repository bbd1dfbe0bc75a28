"""Waits longer than paddle's 30-second gloo limit: a rank held back in extraction or in a save is waited for
up to --dist-timeout, and past it the job ends in one line."""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import copy_of_project

from {{ cookiecutter.project_slug }} import settings, workspace

pytestmark = pytest.mark.slow

HELD_BACK_S = 36  # over paddle's 30-second gloo limit

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


def _slow_first_write(self, training, *rest):  # a test makes the first save slow, as a network disk would
    if training["epoch"] == 1:
        _time.sleep({seconds})
    _write(self, training, *rest)


Checkpointer._write = _slow_first_write
"""


def train(project, output, *args: str) -> subprocess.CompletedProcess:
    command = ["bash", "run.sh", "--epochs", "2", "--device", "cpu", "--output-dir", str(output), *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    env.update(NPROC_PER_NODE="2", PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)


def test_a_rank_held_back_past_gloos_30_s_in_extraction_and_in_a_save_is_waited_for_up_to_the_dist_timeout(
    project_root, tmp_path
):
    slow_extraction, slow_save = (code.format(seconds=HELD_BACK_S) for code in (SLOW_EXTRACTION, SLOW_FIRST_SAVE))
    project = copy_of_project(project_root, tmp_path / "project", archive=slow_extraction, checkpoint=slow_save)
    output = tmp_path / "output"
    started = time.monotonic()

    result = train(project, output, "--dist-timeout", "120")

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert time.monotonic() - started > 2 * HELD_BACK_S
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]


def test_a_save_longer_than_the_dist_timeout_ends_the_job_in_one_line_that_names_the_wait(project_root, tmp_path):
    project = copy_of_project(project_root, tmp_path / "project", checkpoint=SLOW_FIRST_SAVE.format(seconds=20))

    result = train(project, tmp_path / "output", "--dist-timeout", "5")

    assert result.returncode != 0
    errors = {line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")}
    assert errors == {
        "error: waited --dist-timeout 5 s for rank 0's checkpoint save: raise --dist-timeout if that takes longer "
        "(paddle's own collectives on CPUs still give up after 30 s)"
    }, result.stdout[-2000:] + result.stderr[-2000:]
