"""Who starts the processes: run.py spawns them itself only with the spawn launcher, and only once."""

import argparse
import logging

import pytest
from launching import launch_ranks

from {{ cookiecutter.project_slug }} import distributed

LAUNCHER_VARIABLES = (
    "PADDLE_TRAINER_ID",
    "PADDLE_TRAINERS_NUM",
    "PADDLE_LOCAL_RANK",
    "PADDLE_RANK_IN_NODE",
    "PADDLE_TRAINER_ENDPOINTS",
    "NPROC_PER_NODE",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    level = root.level
    yield monkeypatch
    root.setLevel(level)  # launch() quietens the root logger before it spawns


@pytest.mark.parametrize(
    "variables, ranks",
    [
        ({}, (0, 0, 1)),
        ({"PADDLE_TRAINER_ID": "3", "PADDLE_LOCAL_RANK": "1", "PADDLE_TRAINERS_NUM": "4"}, (3, 1, 4)),  # launch
        ({"PADDLE_TRAINER_ID": "2", "PADDLE_RANK_IN_NODE": "0", "PADDLE_TRAINERS_NUM": "4"}, (2, 0, 4)),  # older ones
        ({"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2"}, (1, 1, 2)),  # spawn, one machine
    ],
)
def test_ranks_come_from_the_launcher_and_default_to_one_process(clean_env, variables, ranks):
    for name, value in variables.items():
        clean_env.setenv(name, value)

    assert distributed.read_ranks() == ranks


class FinishedRanks:
    """What paddle.distributed.spawn(join=False) returns, once every rank has ended well."""

    processes = []

    def join(self) -> bool:
        return True


@pytest.mark.parametrize(
    "launcher, variables, spawns",
    [
        ("spawn", {"NPROC_PER_NODE": "2"}, True),  # bash run.sh, or python run.py, with the spawn launcher
        ("spawn", {"NPROC_PER_NODE": "1"}, False),  # one process: no children needed
        ("spawn", {"NPROC_PER_NODE": "2", "PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2"}, False),  # a child
        ("launch", {"NPROC_PER_NODE": "2"}, False),  # the launcher started every process already
        ("fleetrun", {"NPROC_PER_NODE": "2"}, False),
    ],
)
def test_run_py_spawns_its_processes_only_when_no_launcher_did(clean_env, launcher, variables, spawns):
    for name, value in variables.items():
        clean_env.setenv(name, value)
    clean_env.setattr(distributed, "LAUNCHER", launcher)
    spawned, ran_here = [], []

    def spawn(function, args, nprocs, join):
        spawned.append(nprocs)
        return FinishedRanks()

    clean_env.setattr(distributed.dist, "spawn", spawn)
    clean_env.setattr(distributed.signal, "signal", lambda signum, handler: None)  # pytest keeps its own

    args = argparse.Namespace(device="cpu")
    distributed.launch(lambda args: ran_here.append(args), args)

    assert spawned == ([2] if spawns else [])
    assert ran_here == ([] if spawns else [args])


FLEET_RANK = """
import paddle
from paddle.distributed import collective

from {{ cookiecutter.project_slug }} import distributed

distributed.LAUNCHER = "fleetrun"
env = distributed.setup("cpu")
distributed.wrap_model(paddle.nn.Linear(2, 2), env)
joined = sorted(gid for gid, group in collective._get_group_map().items() if group.process_group is not None)
print(f"rank {env.rank} joined {joined}", flush=True)
distributed.barrier()
"""


def test_fleet_on_cpu_joins_only_the_global_group_where_each_new_gloo_group_could_fail_to_connect(
    project_root, tmp_path
):
    """Four ranks: fleet.init() makes its data-parallel groups, which paddle's gloo may wire to a stale address."""
    returncode, logs = launch_ranks(FLEET_RANK, 4, project_root, tmp_path)

    assert returncode == 0, logs[-3000:]
    assert sorted(line for line in logs.splitlines() if " joined " in line) == [
        f"rank {rank} joined [0]" for rank in range(4)
    ]


STORE_RANK = """
import os
import socket

from {{ cookiecutter.project_slug }} import distributed

env = distributed.setup("cpu")
store = os.environ.get("PADDLE_MASTER") or os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")[0]
port, delays = int(store.rpartition(":")[2]), []
for name in os.listdir("/proc/self/fd"):
    try:
        connection = socket.socket(fileno=os.dup(int(name)))
    except OSError:
        continue
    with connection:
        try:
            ends = connection.getsockname()[1], connection.getpeername()[1]
        except (OSError, IndexError, TypeError):
            continue
        if port in ends:
            delays.append(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0)
print(f"rank {env.rank}: {len(delays)} store connection(s), {sum(delays)} with Nagle's delay", flush=True)
distributed.barrier()
"""


@pytest.mark.slow
def test_every_rank_talks_to_the_rendezvous_store_without_nagles_delay(project_root, tmp_path):
    """Each store call waited 44 ms for a delayed ACK; the project's waits make many of them at start-up."""
    returncode, logs = launch_ranks(STORE_RANK, 2, project_root, tmp_path)

    assert returncode == 0, logs[-3000:]
    lines = [line for line in logs.splitlines() if "store connection" in line]
    assert len(lines) == 2, logs[-3000:]
    assert all(line.endswith(", 0 with Nagle's delay") and ": 0 store" not in line for line in lines), lines
