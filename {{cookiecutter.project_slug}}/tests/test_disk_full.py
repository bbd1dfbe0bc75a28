"""A disk that fills during a save: one error line, the last checkpoint kept whole, and the same command
resumes from it on a disk with room."""

import json
import os
import re
import subprocess
import sys

import pytest

from {{ cookiecutter.project_slug }} import settings, workspace

pytestmark = pytest.mark.slow

ROOMY = 64 * 2**20
# PyTorch's sharded saves (every rank its shards, written in the background) fill a disk too.
STRATEGIES = ["ddp", "fsdp"] if settings.FRAMEWORK == "pytorch" else ["ddp"]
LAUNCHERS_LINE = "(its own error is above)"  # torchrun's closing line, after the rank's own


@pytest.fixture
def small_disk(tmp_path):
    """A file system of its own (tmpfs), which the test can shrink and grow."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root (CI runs the suite as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={ROOMY}", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], check=True)


def resize(disk, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def used_bytes(disk) -> int:
    stats = os.statvfs(disk)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def train(project_root, output, epochs: int, strategy: str = "ddp") -> subprocess.CompletedProcess:
    command = ["bash", "run.sh", "--epochs", str(epochs), "--device", "cpu", "--output-dir", str(output)]
    command += ["--strategy", strategy]
    if settings.DATASET == "zip":  # the data outside the small disk: only the outputs fill it
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent.parent / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env.update(NPROC_PER_NODE="2", PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])
    return subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=300)


def epochs_in_metrics(output) -> list[int]:
    return [json.loads(line)["epoch"] for line in (output / "metrics.jsonl").read_text().splitlines()]


def one_checkpoint(checkpoints) -> int:
    """The bytes of the last checkpoint: its last.* files, or the folder a sharded save's link points at."""
    files = list(checkpoints.glob("last.*")) or list((checkpoints / "last").resolve().iterdir())
    return sum(path.stat().st_size for path in files)


def leftovers(checkpoints) -> list[str]:
    """What a save left beside the checkpoints: temporary files, staging folders, a failed save's shards."""
    kept = {path.name for path in checkpoints.glob("[lb]*")}
    kept |= {(checkpoints / link).resolve().name for link in ("last", "best") if (checkpoints / link).is_symlink()}
    return sorted(path.name for path in checkpoints.iterdir() if path.name not in kept)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_disk_that_fills_at_the_second_save_ends_in_one_line_and_the_same_command_resumes(
    project_root, small_disk, strategy
):
    output = small_disk / "output"
    first = train(project_root, output, epochs=1, strategy=strategy)  # how much one epoch's outputs take here
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoint_bytes = one_checkpoint(output / "checkpoints")
    used = used_bytes(small_disk)
    subprocess.run(["rm", "-rf", str(output)], check=True)
    resize(small_disk, used + checkpoint_bytes // 2)  # room for epoch 1's files, not for the next checkpoint

    full = train(project_root, output, epochs=3, strategy=strategy)

    assert full.returncode == 1
    output_lines = (full.stdout + full.stderr).splitlines()  # paddle's launcher shows rank 0's on stdout
    errors = [line for line in output_lines if line.startswith("error:") and LAUNCHERS_LINE not in line]
    assert len(errors) == 1, full.stdout[-2000:] + full.stderr[-2000:]
    needs = (
        rf"no space left in {output / 'checkpoints'} for the checkpoint: it needs about [\d.]+ MB, [\d.]+ MB are free"
    )
    assert re.search(needs, errors[0]), errors[0]
    assert "Traceback" not in full.stdout + full.stderr
    assert leftovers(output / "checkpoints") == []
    assert epochs_in_metrics(output)[0] == 1

    resize(small_disk, ROOMY)
    again = train(project_root, output, epochs=3, strategy=strategy)

    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stdout + again.stderr and "(epoch 1)" in again.stdout + again.stderr
    assert epochs_in_metrics(output) == [1, 2, 3]
