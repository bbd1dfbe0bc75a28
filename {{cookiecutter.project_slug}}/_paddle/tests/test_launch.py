"""Who starts the processes: run.py spawns them itself only with the spawn launcher, and only once."""

import logging

import pytest

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

    distributed.launch(lambda args: ran_here.append(args), "args")

    assert spawned == ([2] if spawns else [])
    assert ran_here == ([] if spawns else ["args"])
