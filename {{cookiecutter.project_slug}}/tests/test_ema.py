"""--ema: validation, best.*, --evaluate and export.py use the averaged weights; --ema 0 is a run without it, and a
resumed run goes on averaging exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_sh

from {{ cookiecutter.project_slug }} import inference, settings, workspace

pytestmark = pytest.mark.slow

TIMEOUT_S = 300
TIMINGS = ("epoch_time_s", "data_wait")  # clock readings, not results


def data_flags(output: Path) -> list[str]:
    """Where a dataset=zip project's sample is extracted: beside `output`, not into the project's data/."""
    sample = ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    return sample if settings.DATASET == "zip" else []


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
