"""Who starts the processes: run.py spawns them itself only when no launcher already did."""

import pytest

from {{ cookiecutter.project_slug }} import cli, distributed

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "variables, launched",
    [
        ({}, False),
        ({"RANK": "1", "WORLD_SIZE": "2"}, False),  # a Kubernetes operator's pod (machine) rank
        ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}, True),  # torchrun, torch.distributed.launch
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, True),  # srun, one task per GPU
        ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, False),  # one task that spawns
    ],
)
def test_a_process_counts_as_launched_only_when_a_launcher_made_it_one_rank(clean_env, variables, launched):
    for name, value in variables.items():
        clean_env.setenv(name, value)

    assert distributed.launched_as_rank() is launched


@pytest.mark.parametrize(
    "variables, ranks",
    [
        ({}, (0, 0, 1)),
        ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, (3, 1, 4)),
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}, (2, 0, 4)),
    ],
)
def test_ranks_come_from_the_launcher_or_slurm_and_default_to_one_process(clean_env, variables, ranks):
    for name, value in variables.items():
        clean_env.setenv(name, value)

    assert distributed.read_ranks() == ranks


def test_local_rank_comes_from_the_environment_first_and_the_old_launch_flag_second(clean_env):
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("LOCAL_RANK", "")
    clean_env.delenv("LOCAL_RANK")  # so that the variable the flag sets is removed after the test
    cli.parse_args(["--local-rank", "1"])  # what an old torch.distributed.launch passes alone
    assert distributed.read_ranks() == (3, 1, 4)

    clean_env.setenv("LOCAL_RANK", "2")
    cli.parse_args(["--local-rank", "1"])
    assert distributed.read_ranks() == (3, 2, 4)
