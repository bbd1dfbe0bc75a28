"""The project's launcher module, which run.sh starts: paddle's launcher, with a job's status that is its failure's."""

import pytest
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
