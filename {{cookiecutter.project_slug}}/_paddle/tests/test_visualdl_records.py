"""VisualDL shows one records file per folder: a resumed run appends to it, after what a crash left."""

from curves import CPU, RECORDS, curve

from {{ cookiecutter.project_slug }} import tracking
from {{ cookiecutter.project_slug }}.distributed import DistEnv

RANK_0 = DistEnv(0, 0, 2, CPU)


def records_file(output_dir):
    return output_dir / "visualdl" / RECORDS


def test_a_resumed_run_appends_to_the_one_records_file(tmp_path):
    killed = tracking.Tracker(tmp_path, RANK_0)
    killed.loss(1, 1.0)
    killed.loss(2, 0.9)  # past the checkpoint, trained again below
    killed.close()
    size_before = records_file(tmp_path).stat().st_size

    resumed = tracking.Tracker(tmp_path, RANK_0, start_step=1)
    for step in range(2, 20):
        resumed.loss(step, 0.5)
    resumed.close()

    assert [path.name for path in (tmp_path / "visualdl").iterdir()] == [RECORDS]
    assert records_file(tmp_path).stat().st_size > size_before
    assert curve(tmp_path, "train/loss")[:3] == [(1, 1.0), (2, 0.5), (3, 0.5)]


def test_a_record_torn_by_a_crash_is_dropped_on_resume(tmp_path):
    tracker = tracking.Tracker(tmp_path, RANK_0)
    tracker.loss(1, 1.0)
    tracker.epoch(1, {"epoch": 1, "val_acc": 0.5})
    tracker.close()
    with open(records_file(tmp_path), "ab") as records:
        records.write(b"\x40\x00\x00\x00\x00\x00\x00\x00half a record")

    resumed = tracking.Tracker(tmp_path, RANK_0, start_step=1, start_epoch=1)
    resumed.loss(2, 0.5)
    resumed.close()

    assert curve(tmp_path, "train/loss") == [(1, 1.0), (2, 0.5)]
