"""Data loading keeps the device busy: the default workers, the usable cores, and the loader watched."""

import json
import logging
import os
import subprocess
import sys

import pytest
from conftest import SLOW_DATA, copy_of_project, default_data_sizes

from {{ cookiecutter.project_slug }} import cli, hardware, logs, settings, workspace
from {{ cookiecutter.project_slug }}.logs import CHECK_AFTER_STEPS, LoaderWatch


@pytest.mark.parametrize(
    "on_gpu, processes, cores, workers",
    [(False, 1, 16, 0), (False, 2, 2, 0), (True, 1, 16, 8), (True, 8, 16, 1), (True, 2, 8, 3), (True, 1, 2, 1)],
)
def test_the_default_workers_come_from_the_device_and_the_cores_of_each_process(on_gpu, processes, cores, workers):
    assert hardware.loader_workers(on_gpu, processes, cores) == workers


@pytest.mark.parametrize(
    "files, cores",
    [
        ({"cpu.max": "150000 100000\n"}, 1),  # cgroup v2, a pod limited to 1.5 cores
        ({"cpu.max": "max 100000\n"}, None),  # no limit: the affinity
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_the_usable_cores_are_the_affinity_capped_by_the_containers_cpu_quota(tmp_path, files, cores):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    assert hardware.usable_cores(tmp_path) == (cores or len(os.sched_getaffinity(0)))


class Clock:
    """The wall and thread CPU clocks that LoaderWatch reads, moved by the batches below: the tests do not
    depend on how much of a core a loaded machine lends them."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(logs, "time", clock)
    return clock


def timed(clock: Clock, seconds: float, busy: bool, count: int = CHECK_AFTER_STEPS + 5):
    """Batches that each take `seconds` to come: computed by the loop's thread (busy) or waited for (storage)."""
    for index in range(count):
        clock.wall += seconds
        clock.cpu += seconds if busy else 0.0
        yield index


def test_a_loader_that_waits_on_storage_is_named_once_with_the_flag_to_raise(caplog, clock):
    watch = LoaderWatch(workers=0, loader_cores=0, is_main=True)

    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # two epochs: said once
            assert list(watch.batches(timed(clock, 0.01, busy=False))) == list(range(CHECK_AFTER_STEPS + 5))

    [hint] = [record.getMessage() for record in caplog.records]
    assert "waits for its data" in hint and "on storage" in hint and "try --workers 4" in hint
    assert watch.data_wait > 0.9


def test_a_first_step_that_compiles_for_long_does_not_hide_a_slow_loader(caplog, clock):
    watch = LoaderWatch(workers=0, loader_cores=0, is_main=True)

    with caplog.at_level(logging.WARNING):
        for index in watch.batches(timed(clock, 0.01, busy=False)):
            clock.wall += 30.0 if index == 0 else 0.001  # --compile's first step, then steps shorter than a read

    [hint] = [record.getMessage() for record in caplog.records]
    assert "training waits for its data 91 % of the time" in hint
    assert watch.data_wait < 0.1  # the epoch's own figure keeps the whole epoch


def test_a_gpu_process_whose_loader_computes_is_told_the_free_cores(caplog, clock):
    watch = LoaderWatch(workers=2, loader_cores=7, is_main=True)

    with caplog.at_level(logging.WARNING):
        list(watch.batches(timed(clock, 0.005, busy=True)))

    [hint] = [record.getMessage() for record in caplog.records]
    assert "with --workers 2 (7 cores are free for them): try --workers 7" in hint


def test_a_loader_that_computes_on_a_cpu_run_has_no_cores_to_spare_and_says_nothing(caplog, clock):
    watch = LoaderWatch(workers=0, loader_cores=0, is_main=True)  # the training's threads use every core

    with caplog.at_level(logging.WARNING):
        list(watch.batches(timed(clock, 0.005, busy=True)))

    assert caplog.records == []
    assert watch.data_wait > 0.9


def read_metrics(output) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def run_py(project, output, *args) -> str:
    command = [sys.executable, "run.py", "--epochs", "1", "--device", "cpu", "--output-dir", str(output), *args]
    if settings.DATASET == "zip":
        command += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output.parent / "data")]
    result = subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return (output / "train.log").read_text()


def test_a_run_on_a_slow_disk_says_so_once_and_a_default_run_says_nothing(project_root, tmp_path):
    # Batches small enough for an epoch of twice CHECK_AFTER_STEPS steps, however small the data: the watch judges
    # the loader after CHECK_AFTER_STEPS steps of an epoch.
    train_size, _ = default_data_sizes(tmp_path / "sample" / settings.SAMPLE)
    batch_size = min(cli.parse_args([]).batch_size, train_size // (2 * CHECK_AFTER_STEPS))
    batch = ["--batch-size", str(batch_size)]
    default_log = run_py(project_root, tmp_path / "default" / "output", *batch)
    [default_epoch] = read_metrics(tmp_path / "default" / "output")
    # A disk that takes three times the default epoch to read the training set: training waits for it, however much
    # the task's model computes, and whether the loader reads the next batch while the model computes or after.
    read_s = max(0.004, 3 * default_epoch["epoch_time_s"] / train_size)
    project = copy_of_project(project_root, tmp_path / "project", data=f"{SLOW_DATA}\nSAMPLE_READ_S = {read_s}\n")

    slow_log = run_py(project, tmp_path / "slow" / "output", *batch)

    assert slow_log.count("training waits for its data") == 1
    assert "on storage" in slow_log and "--workers 0" in slow_log
    assert "training waits for its data" not in default_log
    assert "0 loader worker(s) per process" in default_log  # on a CPU
    for output in (tmp_path / "slow" / "output", tmp_path / "default" / "output"):
        rows = read_metrics(output)
        assert all(0 <= row["data_wait"] <= 1 for row in rows) and rows
