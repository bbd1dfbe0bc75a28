"""metrics.jsonl stays one line per finished epoch across crashes and resumes."""

import json

from {{ cookiecutter.project_slug }} import logs


def write_epochs(path, epochs):
    for epoch in epochs:
        logs.append_metrics(path, {"epoch": epoch, "train_loss": 1.0 / epoch})


def test_resuming_forgets_epochs_the_checkpoint_does_not_cover(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_epochs(path, [1, 2, 3])

    logs.drop_metrics_after(path, 2)

    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2]


def test_a_line_torn_by_a_crash_is_dropped_instead_of_blocking_the_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_epochs(path, [1, 2])
    with open(path, "a") as file:
        file.write('{"epoch": 3, "train_lo')

    logs.drop_metrics_after(path, 2)
    write_epochs(path, [3])

    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2, 3]
