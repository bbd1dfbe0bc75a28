"""--ema: validation, best.*, --evaluate and export.py use the averaged weights; --ema 0 is a run without it, and a
resumed run goes on averaging exactly."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from {{ cookiecutter.project_slug }} import cli, inference, settings, workspace

pytestmark = pytest.mark.slow

TIMEOUT_S = 300
TIMINGS = ("epoch_time_s", "data_wait")  # clock readings, not results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def data_flags(output: Path) -> list[str]:
    """Where a dataset=zip project's sample is extracted: beside `output`, not into the project's data/."""
    sample = ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    return sample if settings.DATASET == "zip" else []


def run_sh(project_root, output, *args: str) -> str:
    """run.sh on 2 processes; its log."""
    command = ["bash", "run.sh", "--device", "cpu", "--output-dir", str(output), *args, *data_flags(output)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env.update(NPROC_PER_NODE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (output / "train.log").read_text(encoding="utf-8")


def run_py(project_root, script: str, *args: str) -> subprocess.CompletedProcess:
    """A script of the project (run.py, export.py) in one process."""
    command = [sys.executable, script, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NPROC_PER_NODE")}
    result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def metrics(output: Path) -> list[dict]:
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [{key: value for key, value in record.items() if key not in TIMINGS} for record in records]


@pytest.fixture(scope="module")
def averaged_run(project_root, tmp_path_factory) -> Path:
    """2 epochs of --ema 0.9 on 2 processes, uninterrupted, each epoch's save kept (--keep-best 2)."""
    output = tmp_path_factory.mktemp("averaged") / "output"
    run_sh(project_root, output, "--epochs", "2", "--ema", "0.9", "--keep-best", "2")
    return output


def test_ema_0_trains_and_validates_exactly_as_a_run_without_it(project_root, tmp_path):
    run_sh(project_root, tmp_path / "plain", "--epochs", "1")
    run_sh(project_root, tmp_path / "ema0", "--epochs", "1", "--ema", "0")
    assert metrics(tmp_path / "ema0") == metrics(tmp_path / "plain")


def test_a_resumed_run_goes_on_averaging_exactly_and_evaluate_and_export_take_the_averages_unless_raw(
    project_root, tmp_path, averaged_run
):
    output = tmp_path / "resumed"
    first_epoch = next((averaged_run / "checkpoints").glob("epoch-1.p*"))  # its .pt, or .pdparams
    log = run_sh(project_root, output, "--epochs", "2", "--resume", str(first_epoch))  # without --ema: the run's own

    assert "this run goes on with the resumed run's --ema 0.9" in log
    assert metrics(output) == metrics(averaged_run)[1:]  # validated on the averages, as if never stopped

    last = inference.checkpoint_path(output, "last")
    evaluated = {}
    for weights in ("ema", "raw"):
        run_py(project_root, "run.py", "--device", "cpu", "--evaluate", "--weights", weights, "--output-dir",
               str(output), *data_flags(output))  # fmt: skip
        evaluated[weights] = json.loads((output / "eval.json").read_text())
        run_py(project_root, "export.py", "--weights", weights, str(last), str(tmp_path / f"{weights}{last.suffix}"))
    assert evaluated["ema"]["val_loss"] == pytest.approx(metrics(output)[-1]["val_loss"], rel=1e-6)
    assert evaluated["raw"]["val_loss"] != evaluated["ema"]["val_loss"]
    assert (tmp_path / f"ema{last.suffix}").read_bytes() != (tmp_path / f"raw{last.suffix}").read_bytes()


@pytest.mark.skipif(settings.FRAMEWORK != "pytorch", reason="Paddle's sharding: test_sharded_checkpoint.py")
def test_under_fsdp_each_rank_averages_its_shard_as_ddp_averages_the_whole(project_root, tmp_path, averaged_run):
    assert cli.STRATEGIES[1] == "fsdp"
    run_sh(project_root, tmp_path / "fsdp", "--epochs", "2", "--ema", "0.9", "--strategy", "fsdp")

    for ddp, fsdp in zip(metrics(averaged_run), metrics(tmp_path / "fsdp"), strict=True):
        results = [key for key in ddp if key == "train_loss" or key.startswith("val_")]  # the task's metrics
        assert [fsdp[key] for key in results] == pytest.approx([ddp[key] for key in results], rel=1e-5)
