"""Slow tier: a rank that stops answering mid-epoch ends the job in one error line, not a watchdog's report."""

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import tool_env
from test_training import SLOW_STEPS, free_port, processes_left_in

pytestmark = pytest.mark.slow

COLLECTIVE_TIMEOUT_STATUS = 4  # errors.py's


def worker(project: Path, rank: int) -> int:
    """The pid of the process that trains as `rank` (the variable its launcher gave it says which)."""
    variables = {f"RANK={rank}".encode(), f"PADDLE_TRAINER_ID={rank}".encode()}
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == project.resolve():
                if variables & set((proc / "environ").read_bytes().split(b"\0")):
                    found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return min(found)  # the rank itself: the helpers it starts (a resource tracker) inherit its variables


def stop_rank_1_at(log: Path, line: str, project: Path, ranks: dict, job: subprocess.Popen) -> None:
    """SIGSTOP rank 1 once `line` is in rank 0's `log` (while the job runs); `ranks` gets the two pids and the
    moment."""
    while job.poll() is None:
        if log.exists() and line in log.read_text(encoding="utf-8", errors="replace"):
            ranks["waiting"], ranks["stopped"] = worker(project, 0), worker(project, 1)
            os.kill(ranks["stopped"], signal.SIGSTOP)
            ranks["at"] = time.monotonic()
            return
        time.sleep(0.02)


def ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


@pytest.mark.parametrize("framework", ["pytorch", "paddle"])
def test_a_rank_stopped_mid_epoch_ends_the_job_in_one_error_line_that_says_where(bake, tmp_path, framework):
    project = bake(framework=framework, nodes="multi")
    with open(project / "dist_train" / "model.py", "a", encoding="utf-8") as model:
        model.write(SLOW_STEPS)  # an epoch of a second or so: the stop lands inside one
    args = ["--epochs", "2", "--log-every", "1", "--dist-timeout", "5", "--output-dir", str(tmp_path / "out")]
    env = tool_env(NPROC_PER_NODE="2", MASTER_PORT=str(free_port()))
    job = subprocess.Popen(
        ["bash", "run.sh", *args], cwd=project, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    hung = threading.Timer(240, os.killpg, (job.pid, signal.SIGKILL))  # a job that never ends fails, not hangs
    hung.start()
    # Rank 0's log, not the console: paddle's launcher copies worker 0's output to the console every 2 s or so,
    # later than a step of this epoch.
    ranks = {}
    stopper = threading.Thread(
        target=stop_rank_1_at, args=(tmp_path / "out" / "train.log", "epoch 1 step 4/", project, ranks, job)
    )
    stopper.start()
    output, stopped, waiting, said_after = [], None, None, float("inf")
    try:
        for line in job.stdout:
            output.append(line)
            if line.startswith("error: ") and ranks:
                waiting, stopped, stopped_at = ranks["waiting"], ranks["stopped"], ranks["at"]
                said_after = time.monotonic() - stopped_at
                # torchrun's SIGTERM cannot end a stopped process: it sends SIGKILL after its shutdown grace (30 s),
                # which this test does not wait for, once rank 0 has ended and torchrun has seen it.
                deadline = time.monotonic() + 30
                while not ended(waiting) and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(1)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stopped, signal.SIGKILL)
        job.wait(timeout=60)
    finally:
        hung.cancel()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        stopper.join()
        stopped = ranks.get("stopped")
        if stopped:
            with contextlib.suppress(ProcessLookupError):  # (paddle's launcher killed it already)
                os.kill(stopped, signal.SIGKILL)

    console = "".join(output)
    errors = [line for line in output if line.startswith("error: ")]
    assert job.returncode == COLLECTIVE_TIMEOUT_STATUS, console[-3000:]
    assert len(errors) == 1, console[-3000:]
    assert "Traceback" not in console and "terminate called" not in console
    if framework == "pytorch":
        said = r"error: a collective timed out in epoch 1 step \d+/\d+: rank 1 did not answer for --dist-timeout 5 s: "
        assert re.match(said, errors[0]), errors[0]
        assert said_after < 5 + 5 + 10  # --dist-timeout, the others' check-in (roll_call.CHECK_IN_S), a margin
    else:  # paddle ends the rank that waited in C++ after gloo's fixed 30 s: its launcher says so
        said = "error: a collective timed out in a training step: a rank did not answer for paddle's 30 s"
        assert errors[0].startswith(said), errors[0]
        assert said_after < 30 + 15
    assert processes_left_in(project) == []
