"""Slow tier: an elastic job of two machines on the loopback (NNODES=1:2) loses one mid-epoch, goes on alone, and
takes it back when it returns: torchrun's rendezvous, and Paddle's launcher meeting in a real etcd server."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import SLOW_STEPS, tool_env

pytestmark = pytest.mark.slow

EPOCHS = 10  # of 50 ms steps (SLOW_STEPS): machine 1 comes back and joins while machine 0 still trains alone


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """HOST:PORT of an etcd server started for the session (Debian's etcd-server, installed where missing)."""
    if shutil.which("etcd") is None:
        assert os.geteuid() == 0, "etcd is missing and only root can install it: apt-get install etcd-server"
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=300",
                                                "--no-install-recommends", "etcd-server"]):  # fmt: skip
            subprocess.run(
                command, check=True, capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            )
    folder = tmp_path_factory.mktemp("etcd")
    client, peer = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    server = subprocess.Popen(
        ["etcd", "--data-dir", str(folder / "data"), "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
        stdout=open(folder / "etcd.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    endpoint = client.removeprefix("http://")
    wait_until(lambda: port_answers(int(endpoint.rpartition(":")[2])), 30, "etcd's client port")
    yield endpoint
    server.terminate()
    server.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def epochs_logged(output: Path) -> list[dict]:
    path = output / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def descendants(pid: int) -> list[int]:
    found = []
    for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
        found += [int(child), *descendants(int(child))]
    return found


def lose(machine: subprocess.Popen) -> None:
    """A machine gone without a word (a hardware fault, a spot instance taken back): its launcher and every rank
    killed at once. The ranks run in sessions of their own, so killing the launcher's group is not enough."""
    pids = [machine.pid, *descendants(machine.pid)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    machine.wait()


@pytest.mark.parametrize("framework", ["pytorch", "paddle"])
def test_an_elastic_job_loses_a_machine_mid_epoch_goes_on_alone_and_takes_it_back(bake, tmp_path, framework, request):
    machine0 = bake(nodes="multi", framework=framework)
    with (machine0 / "model.py").open("a") as model:
        model.write(SLOW_STEPS)
    machine1 = tmp_path / "machine1"
    shutil.copytree(machine0, machine1)
    shared = tmp_path / "shared"  # the output folder both machines see (a network file system)
    env = {"NNODES": "1:2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NPROC_PER_NODE": "1"}
    if framework == "paddle":
        env["ETCD_ENDPOINT"] = request.getfixturevalue("etcd")
    args = ["--epochs", str(EPOCHS), "--batch-size", "16", "--save-every-steps", "5", "--output-dir", str(shared)]

    def start(machine: Path, rank: int, log: str) -> subprocess.Popen:
        return subprocess.Popen(
            ["bash", "run.sh", *args], cwd=machine, env=tool_env(NODE_RANK=str(rank), **env),
            stdout=open(tmp_path / log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    jobs = [start(machine0, 0, "machine0.log")]
    try:
        # On one host every machine is MASTER_ADDR's: the first to listen hosts the rendezvous, as machine 0 does.
        if framework == "pytorch":
            wait_until(lambda: port_answers(int(env["MASTER_PORT"])), 60, "machine 0's rendezvous")
        jobs.append(start(machine1, 1, "machine1.log"))
        wait_until(lambda: len(epochs_logged(shared)) >= 1, 120, "a first epoch")
        time.sleep(1.0)  # into the next epoch, past a step save
        lose(jobs[1])
        wait_until(lambda: any(e["world_size"] == 1 for e in epochs_logged(shared)), 180, "an epoch on machine 0 alone")
        jobs.append(start(machine1, 1, "machine1-back.log"))
        status, back_status = jobs[0].wait(timeout=400), jobs[2].wait(timeout=60)
    finally:
        for job in jobs:
            if job.poll() is None:
                lose(job)
    console = (tmp_path / "machine0.log").read_text()
    log = (shared / "train.log").read_text()  # rank 0's lines, wherever a restart put rank 0

    assert status == 0 and back_status == 0, console[-4000:]
    if framework == "pytorch":  # the loss in one line (Paddle's rank ends in C++, gloo's own report: see README)
        assert "Traceback" not in console, console[-4000:]
        [lost] = [line for line in console.splitlines() if line.startswith("error: ")]
        assert "another rank closed its connection" in lost and "the elastic job restarts" in lost
    epochs = epochs_logged(shared)
    assert [e["epoch"] for e in epochs] == list(range(1, EPOCHS + 1))  # each epoch once
    sizes = [e["world_size"] for e in epochs]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes  # lost, then joined again
    restarts = [line for line in log.splitlines() if "elastic job " in line and "resumed from" in line]
    assert len(restarts) == 2, log[-4000:]
    assert "world size 1 (the save's was 2: machine(s) lost)" in restarts[0]
    assert "world size 2 (the save's was 1: machine(s) joined)" in restarts[1]
    assert log.count("done: best val_acc") == 1


@pytest.mark.parametrize("framework", ["pytorch", "paddle"])
def test_an_elastic_job_short_of_its_fewest_machines_says_so_while_it_waits_and_stops_at_join_timeout(
    bake, framework, request
):
    project = bake(nodes="multi", framework=framework, dataset="synthetic")
    env = {"NNODES": "2:3", "NODE_RANK": "0", "MASTER_PORT": str(free_port()), "JOIN_TIMEOUT": "8"}
    if framework == "paddle":
        env["ETCD_ENDPOINT"] = request.getfixturevalue("etcd")
    started = time.monotonic()

    result = subprocess.run(
        ["bash", "run.sh"], cwd=project, env=tool_env(NPROC_PER_NODE="1", **env), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip

    assert result.returncode == 1 and time.monotonic() - started < 40, result.stderr[-3000:]
    assert "waiting for at least 2 machine(s) of this elastic job to meet (" in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert (
        errors == [errors[0]] and "fewer than 2 machine(s) of this elastic job met within JOIN_TIMEOUT=8 s" in errors[0]
    )
