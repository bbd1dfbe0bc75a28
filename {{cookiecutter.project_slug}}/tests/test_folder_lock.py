"""One job per output folder: a second job stops before it writes anything; a job that died holds nothing."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import batches_per_epoch, copy_of_project, default_data_sizes

from {{ cookiecutter.project_slug }} import output_folder, settings, task, workspace
from {{ cookiecutter.project_slug }}.distributed import DistEnv

pytestmark = pytest.mark.slow

SLOW_STEPS = """

import functools
import time

_build_model = build_model


@functools.wraps(_build_model)  # the same parameters: the data description fills them as before
def build_model(num_classes, **options):  # noqa: F811 - a test slows every step, to keep a job running
    model = _build_model(num_classes, **options)
    model.register_forward_pre_hook(lambda module, inputs: time.sleep({step_s}))
    return model
"""
EPOCH_S = 5  # how long the slowed jobs' epochs take, the data being large or small


@pytest.fixture(scope="module")
def step_s(tmp_path_factory) -> float:
    """The sleep per step that makes an epoch of two processes on the project's data take EPOCH_S seconds."""
    train_size, _ = default_data_sizes(tmp_path_factory.mktemp("sample") / settings.SAMPLE)
    return EPOCH_S / batches_per_epoch(train_size, nproc=2)


@pytest.fixture
def slow_project(project_root, tmp_path, step_s):
    return copy_of_project(project_root, tmp_path / "project", model=SLOW_STEPS.format(step_s=step_s))


def command(output, *script: str) -> list[str]:
    args = ["--epochs", "2", "--device", "cpu", "--output-dir", str(output)]
    if settings.DATASET == "zip":
        args += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    return [*script, *args]


def environment(nproc: int = 2, wait_s: float = 60) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    path = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    return {**env, "NPROC_PER_NODE": str(nproc), "PATH": path, output_folder.WAIT_VARIABLE: str(wait_s)}


def start_and_wait_for_training(project, output) -> subprocess.Popen:
    job = subprocess.Popen(
        command(output, "bash", "run.sh"), cwd=project, env=environment(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not ((output / "train.log").exists() and "process(es) on" in (output / "train.log").read_text()):
        assert job.poll() is None and time.monotonic() < deadline, "the first job did not start training"
        time.sleep(0.05)
    return job


def kill_job(job: subprocess.Popen, output) -> None:
    """SIGKILL run.sh's process group, as `kill -9` does; ranks that paddle's launcher started in sessions of
    their own die with it. Then wait until no process of the job is left."""
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", str(output)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "a process of the killed job is still running"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["run.sh", "python run.py"])
def test_a_second_job_on_a_running_jobs_folder_stops_before_it_writes_anything(how, slow_project, tmp_path):
    output = tmp_path / "output"
    first = start_and_wait_for_training(slow_project, output)
    files = {path.relative_to(output) for path in output.rglob("*")}
    try:
        script = ["bash", "run.sh"] if how == "run.sh" else [sys.executable, "run.py"]
        second = subprocess.run(
            command(output, *script), cwd=slow_project, env=environment(), capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        log_after = (output / "train.log").read_text()
    finally:
        kill_job(first, output)

    assert second.returncode == 1
    assert "waiting for the job" not in second.stderr  # it trains: JOB_LOCK_WAIT is for a job that is stopping
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert errors and all(line == errors[0] for line in errors), second.stderr
    assert f"output folder {output} is in use by another job (host " in errors[0]
    assert f"process {first.pid}" in errors[0] or "process " in errors[0]
    assert log_after.count("process(es) on") == 1  # the second job logged nothing
    assert files <= {path.relative_to(output) for path in output.rglob("*")}  # nothing of the first job's went


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["stopping", "killed"])
def test_the_next_job_waits_for_one_that_is_stopping_and_a_killed_one_holds_nothing(signum, slow_project, tmp_path):
    output = tmp_path / "output"
    first = start_and_wait_for_training(slow_project, output)

    os.killpg(first.pid, signum)  # scancel (SIGTERM: it saves first), or kill -9; then at once the same command
    result = subprocess.run(
        command(output, "bash", "run.sh"), cwd=slow_project, env=environment(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip

    assert first.wait(timeout=60) == (143 if signum == signal.SIGTERM else -signal.SIGKILL)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    log = (output / "train.log").read_text()
    assert f"done: best val_{task.BEST_METRIC}" in log
    if signum == signal.SIGTERM:
        assert "resumed from" in log


def test_a_holder_told_to_stop_says_so_once_in_the_lock_and_only_then_is_waited_for(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(output_folder.WAIT_VARIABLE, "0.5")
    lock = output_folder.hold(tmp_path, DistEnv(0, 0, 1, "cpu"))
    try:
        training = output_folder.in_use(tmp_path)
        waits_for_training = capsys.readouterr().err
        output_folder.say_stopping()
        output_folder.say_stopping()  # (a second SIGTERM)
        stopping = output_folder.in_use(tmp_path)
        waits_for_stopping = capsys.readouterr().err
    finally:
        output_folder.release(lock)

    assert f"process {os.getpid()}, since " in training and "stopping" not in training and not waits_for_training
    assert stopping.count(", stopping): wait for it to end") == 1 and "stopping, stopping" not in stopping
    assert waits_for_stopping.startswith(f"waiting for the job that holds {tmp_path} to end")
    assert output_folder.in_use(tmp_path) is None  # released


def test_a_restarted_elastic_job_goes_on_where_its_own_lost_rank_0_still_holds_the_lock(tmp_path, monkeypatch):
    # A lost machine's lock on a network file system outlives it: here a process that holds it and sleeps.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; d = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(d, fcntl.LOCK_EX); os.write(d, b'host gone, process 1, since then, elastic job run-7'); "
         "print(flush=True); time.sleep(60)", str(tmp_path / output_folder.LOCK_NAME)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        holder.stdout.readline()  # it holds the lock
        monkeypatch.setenv(output_folder.WAIT_VARIABLE, "1")
        monkeypatch.setenv("ELASTIC_JOB_ID", "run-7")
        started = time.monotonic()
        own = output_folder.in_use(tmp_path)
        waited = time.monotonic() - started
        monkeypatch.setenv("ELASTIC_JOB_ID", "run-8")
        other = output_folder.in_use(tmp_path)
    finally:
        holder.kill()
        holder.wait()

    assert own is None and waited < 1
    assert "in use by another job (host gone, process 1, since then, elastic job run-7)" in other


@pytest.mark.parametrize("how", ["run.sh", "python run.py"])
def test_an_output_folder_that_cannot_be_made_is_one_line_before_training(how, project_root, tmp_path):
    (tmp_path / "taken").write_text("a file where the folder would go")
    script = ["bash", "run.sh"] if how == "run.sh" else [sys.executable, "run.py"]

    result = subprocess.run(
        command(tmp_path / "taken", *script), cwd=project_root, env=environment(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip

    said = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 1
    assert [line for line in said if "error:" in line] == [
        f"error: the output folder {tmp_path / 'taken'} cannot be written (it is a file): give --output-dir one you "
        "may write"
    ], said
    assert not any("Traceback" in line for line in said)
    assert (tmp_path / "taken").read_text() == "a file where the folder would go"
