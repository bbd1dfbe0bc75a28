"""The project's launcher module, which run.sh starts: paddle's launcher, with a job's status that is its failure's."""

import os
import subprocess
import sys

import pytest
from conftest import copy_of_project
from launching import launch_ranks

FAILING_RANK = """
import os
import sys
import time

if os.environ["PADDLE_TRAINER_ID"] == "1":
    sys.exit(3)  # a status nothing but this rank gives: not the launcher's own failure, nor a missing module's
time.sleep(120)  # rank 0 is still at work when rank 1 fails: the launcher stops it with SIGTERM
"""


@pytest.mark.slow
def test_a_job_where_one_worker_fails_ends_with_that_workers_status_not_the_one_the_launcher_stopped(
    project_root, tmp_path
):
    """paddle's own launcher would end with rank 0's -15 (241): a user's `bash run.sh; echo $?` would see that."""
    returncode, logs = launch_ranks(FAILING_RANK, 2, project_root, tmp_path, launcher="{{ cookiecutter.project_slug }}.launcher")

    assert returncode == 3, logs[-3000:]


FAILING_STEP = """

import functools
import os

from .errors import UserError

_build_model = build_model


@functools.wraps(_build_model)  # the same parameters: the data description fills them as before
def build_model(num_classes, **options):  # noqa: F811 - a test fails rank 1 in a training step
    model = _build_model(num_classes, **options)
    forwards = []

    def fail_on_rank_1(module, inputs):
        forwards.append(1)
        if os.environ.get("PADDLE_TRAINER_ID") == "1" and len(forwards) == 6:  # (after the task check's 2 to 4)
            raise UserError("rank 1 cannot go on")

    model.register_forward_pre_hook(fail_on_rank_1)
    return model
"""


# The same failure in the template's own code (not the user's files): a Python traceback rather than one line.
FAILING_EPOCH = """

import os

_run_epochs = run_epochs


def run_epochs(*args, **kwargs):  # noqa: F811 - a test fails rank 1 as its first epoch starts (either loop's)
    if os.environ.get("PADDLE_TRAINER_ID") == "1":
        raise RuntimeError("rank 1 broke")
    return _run_epochs(*args, **kwargs)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, code, said", [("model", FAILING_STEP, "error: rank 1 cannot go on"), ("fit", FAILING_EPOCH, None)]
)
def test_a_rank_that_fails_in_a_training_step_is_the_jobs_failure_not_the_others_gloo_giving_up(
    project_root, tmp_path, module, code, said
):
    """The others' gloo gives up at once on the rank that ended (paddle reports TIMEOUT and ends them in C++): the
    job's line and status are the failed rank's, not a collective timeout's."""
    project = copy_of_project(project_root, tmp_path / "project", **{module: code})
    env = {name: value for name, value in os.environ.items() if name not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(NPROC_PER_NODE="2", PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])

    result = subprocess.run(
        ["bash", "run.sh", "--epochs", "1", "--device", "cpu", "--output-dir", str(tmp_path / "output")],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "timed out" not in output, output[-3000:]
    if said:
        assert [line for line in output.splitlines() if line.startswith("error:")] == [said], output
    else:
        assert "RuntimeError: rank 1 broke" in output, output[-3000:]
