"""The same experiment on any number of processes: --global-batch-size, kept on resume, and --sync-bn."""

import json
import logging
import os
import subprocess
import sys

import pytest

from {{ cookiecutter.project_slug }} import cli, distributed
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.settings import DATASET, FRAMEWORK
from {{ cookiecutter.project_slug }}.state import TrainingState


@pytest.mark.parametrize("batch, world, global_batch, steps", [(32, 1, 256, 8), (32, 2, 256, 4), (32, 8, 256, 1)])
def test_the_accumulation_steps_keep_the_global_batch_on_any_number_of_processes(batch, world, global_batch, steps):
    assert TrainingState().plan_batches(batch, world, 1, global_batch) == steps


def test_without_a_global_batch_the_accumulation_is_grad_accum():
    assert TrainingState().plan_batches(32, 4, 3, None) == 3


def test_a_global_batch_that_is_not_a_multiple_of_batch_times_processes_is_one_line():
    with pytest.raises(UserError, match=r"--global-batch-size 100 is not a multiple of --batch-size 32 x 2 .* = 64"):
        TrainingState().plan_batches(32, 2, 1, 100)


def test_a_resume_on_another_number_of_processes_keeps_the_global_batch_and_says_how(caplog):
    saved = TrainingState(epochs_done=2, global_batch_size=256, grad_accum=4)  # 2 processes of 32

    with caplog.at_level(logging.INFO):
        assert saved.plan_batches(32, 8, 1, None) == 1

    assert "global batch 256 kept on 8 process(es) of batch 32: 1 accumulation steps (were 4)" in caplog.text


def test_a_global_batch_given_on_resume_replaces_the_checkpoints(caplog):
    saved = TrainingState(epochs_done=2, global_batch_size=256, grad_accum=4)

    with caplog.at_level(logging.INFO):
        assert saved.plan_batches(32, 2, 1, 128) == 2

    assert "--global-batch-size 128 replaces the resumed run's 256" in caplog.text


def test_grad_accum_and_global_batch_size_cannot_both_be_given(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--grad-accum", "2", "--global-batch-size", "64"], quiet=True)
    assert "not allowed with argument" in capsys.readouterr().err


def batch_norm_model():
    if FRAMEWORK == "pytorch":
        from torch import nn

        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    from paddle import nn

    return nn.Sequential(nn.Conv2D(3, 4, 3), nn.BatchNorm2D(4), nn.ReLU())


def env_of(world_size: int, gpu: bool) -> distributed.DistEnv:
    if FRAMEWORK == "pytorch":
        import torch

        return distributed.DistEnv(0, 0, world_size, torch.device("cuda", 0) if gpu else torch.device("cpu"))
    return distributed.DistEnv(0, 0, world_size, "gpu:0" if gpu else "cpu")


def layer_names(model) -> list[str]:
    layers = model.modules() if FRAMEWORK == "pytorch" else model.sublayers()
    return [type(layer).__name__ for layer in layers]


def test_sync_bn_makes_batch_norm_synchronised_on_several_gpu_processes(caplog):
    with caplog.at_level(logging.INFO):
        model = distributed.sync_batch_norm(batch_norm_model(), env_of(2, gpu=True), enabled=True)

    assert "SyncBatchNorm" in layer_names(model)
    assert not any(name.startswith("BatchNorm") for name in layer_names(model))
    assert "--sync-bn: 1 batch-norm layer(s) synchronised across 2 processes" in caplog.text


def test_sync_bn_on_cpu_processes_says_each_normalises_its_own_batch(caplog):
    with caplog.at_level(logging.INFO):
        model = distributed.sync_batch_norm(batch_norm_model(), env_of(2, gpu=False), enabled=True)

    assert "SyncBatchNorm" not in layer_names(model)
    assert "synchronised batch norm runs on GPUs only" in caplog.text


@pytest.mark.slow
def test_a_run_resumed_on_fewer_processes_keeps_its_global_batch(project_root, tmp_path):
    output = tmp_path / "output"
    args = ["--synthetic", "--device", "cpu", "--batch-size", "16", "--output-dir", str(output)]
    if DATASET != "synthetic":
        args += ["--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]

    def run(nproc: str, *more: str) -> str:
        result = subprocess.run(
            ["bash", "run.sh", *args, *more], cwd=project_root, env={**env, "NPROC_PER_NODE": nproc},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return (output / "train.log").read_text()

    run("2", "--epochs", "1", "--global-batch-size", "64")
    log = run("1", "--epochs", "2")

    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [(row["world_size"], row["global_batch_size"]) for row in rows] == [(2, 64), (1, 64)]
    assert "global batch 64 kept on 1 process(es) of batch 16: 4 accumulation steps (were 2)" in log
