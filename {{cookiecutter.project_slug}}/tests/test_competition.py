"""A competition's runs: early stopping (--patience, --min-delta) and the K best checkpoints (--keep-best)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from {{ cookiecutter.project_slug }} import save_folders, settings, task, workspace
from {{ cookiecutter.project_slug }}.state import TrainingState

TIMEOUT_S = 600


def keep(directory, epoch: int, value: float, mode: str = "min") -> None:
    """What a Checkpointer of --keep-best 2 does at the end of an epoch: its save, listed if it is among the two best."""
    kept = save_folders.Kept(epoch, value, 2, mode)
    if save_folders.enters_top(directory, kept):
        (directory / f"epoch-{epoch}.pt").write_text("a checkpoint")
        save_folders.record_top(directory, kept, f"epoch-{epoch}.pt")


def test_top_json_lists_the_two_best_best_first_and_removes_the_saves_it_no_longer_lists(tmp_path):
    for epoch, loss in enumerate([0.5, 0.3, 0.4, 0.3, 0.6], start=1):
        keep(tmp_path, epoch, loss)

    # Epoch 4 ties epoch 2: the earlier comes first; epoch 5 never entered.
    assert [(entry["epoch"], entry["value"]) for entry in save_folders.top(tmp_path)] == [(2, 0.3), (4, 0.3)]
    assert sorted(path.name for path in tmp_path.glob("epoch-*")) == ["epoch-2.pt", "epoch-4.pt"]


def test_a_metric_to_maximise_keeps_the_highest_values(tmp_path):
    for epoch, accuracy in enumerate([0.5, 0.7, 0.6], start=1):
        keep(tmp_path, epoch, accuracy, mode="max")

    assert [entry["epoch"] for entry in save_folders.top(tmp_path)] == [2, 3]


def test_a_sharded_save_pushed_out_of_the_top_stays_while_the_last_link_names_it(tmp_path):
    for epoch, loss in enumerate([0.3, 0.4, 0.5], start=1):
        folder = tmp_path / f"save-{epoch}"
        folder.mkdir()
        save_folders.publish(tmp_path, folder, is_best=epoch == 1, kept=save_folders.Kept(epoch, loss, 1, "min"))

    assert [entry["path"] for entry in save_folders.top(tmp_path)] == ["save-1"]
    assert sorted(path.name for path in tmp_path.glob("save-*")) == ["save-1", "save-3"]  # the best, and the last


def test_an_epoch_counts_as_stale_unless_it_improves_on_the_best_by_more_than_min_delta():
    state = TrainingState()
    stale = []
    for epoch, loss in enumerate([1.0, 0.95, 0.5, 0.49, 0.48], start=1):
        state.finish_epoch(epoch, {"loss": loss}, min_delta=0.1)
        stale.append(state.stale_epochs)

    assert stale == [0, 1, 0, 1, 2]
    assert state.best_value == 0.48  # the best checkpoint still follows every improvement
    assert not state.stops_early(3) and state.stops_early(2) and not state.stops_early(None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_sh(project_root, output, *args: str) -> str:
    command = ["bash", "run.sh", "--device", "cpu", "--output-dir", str(output), *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env.update(NPROC_PER_NODE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (output / "train.log").read_text(encoding="utf-8")


@pytest.mark.slow
def test_patience_stops_every_rank_at_one_epoch_counting_across_a_resume_and_keep_best_lists_the_best(
    project_root, tmp_path
):
    output = tmp_path / "output"
    # No epoch improves by a million: each after the first is stale.
    flags = ["--patience", "2", "--min-delta", "1e6", "--keep-best", "2"]
    run_sh(project_root, output, "--epochs", "2", *flags)

    log = run_sh(project_root, output, "--epochs", "6", *flags)  # stale once before, once more at epoch 3
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [record["epoch"] for record in metrics] == [1, 2, 3]
    assert "stopped early after epoch 3: " in log and "(--patience 2)" in log
    assert "done: best" in log.splitlines()[-1]

    rerun = run_sh(project_root, output, "--epochs", "6", *flags)[len(log) :]
    assert "stopped early after epoch 3" in rerun and "done: best" in rerun
    assert len((output / "metrics.jsonl").read_text().splitlines()) == 3  # nothing trained

    checkpoints = output / "checkpoints"
    top = json.loads((checkpoints / "top.json").read_text())
    name, sign = f"val_{task.BEST_METRIC}", -1 if task.BEST_MODE == "max" else 1
    ranked = sorted(metrics, key=lambda record: (sign * record[name], record["epoch"]))
    assert [(entry["epoch"], entry["value"]) for entry in top] == [(one["epoch"], one[name]) for one in ranked[:2]]
    assert all((checkpoints / entry["path"]).exists() for entry in top)
    first = checkpoints / top[0]["path"]
    assert first.read_bytes() == (checkpoints / f"best{Path(first).suffix}").read_bytes()  # the best is the first
