"""The sample task's (image classification's) predictions: predict.py and predict.sh with a checkpoint and a folder
or an archive of images in, a CSV to submit out. A task of your own replaces these tests with its own."""

import csv
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import write_image_folder

from {{ cookiecutter.project_slug }} import cli, inference, settings, workspace

pytestmark = pytest.mark.slow

TIMEOUT_S = 600


def run(command: list[str], cwd: Path, nproc: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(NPROC_PER_NODE=str(nproc), PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert result.returncode == 0 or not check, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def test_images(tmp_path_factory) -> Path:
    """An archive of labelled images wrapped in a top folder, with junk: the sample's val/, or made up (synthetic)."""
    folder = tmp_path_factory.mktemp("images") / "digits"
    if settings.DATASET == "synthetic":
        write_image_folder(folder / "val", [str(label) for label in range(10)], per_class=7)
    elif settings.DATASET == "zip":
        with zipfile.ZipFile(workspace.SAMPLE_ARCHIVE) as sample:
            sample.extractall(folder, [name for name in sample.namelist() if name.startswith("val/")])
    else:
        shutil.copytree(cli.SAMPLE_DATA_DIR / "val", folder / "val")
    path = folder.with_suffix(".zip")
    with zipfile.ZipFile(path, "w") as packed:
        for image in sorted(folder.rglob("*.png")):
            packed.write(image, f"test/{image.relative_to(folder).as_posix()}")
        packed.writestr("__MACOSX/test/._x.png", b"\x00\x05\x16\x07")
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, project_root) -> Path:
    output_dir = tmp_path_factory.mktemp("trained") / "output"
    args = ["--epochs", "2", "--device", "cpu", "--output-dir", str(output_dir)]
    if settings.DATASET == "zip":
        args += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(output_dir.parent / "data")]
    run([sys.executable, "run.py", *args], project_root)
    return inference.checkpoint_path(output_dir, "best")


def read_rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.reader(file))


def test_one_and_two_processes_write_the_same_file_with_one_sorted_row_per_image(
    project_root, checkpoint, test_images, tmp_path
):
    args = ["--checkpoint", str(checkpoint), "--input", str(test_images), "--probabilities", "--batch-size", "64"]
    args += ["--device", "cpu"]  # two processes on a machine: CPUs (one GPU cannot take both)

    run([sys.executable, "predict.py", *args, "--output", str(tmp_path / "one.csv")], project_root)
    run(["bash", "predict.sh", *args, "--output", str(tmp_path / "two.csv")], project_root, nproc=2)

    one = (tmp_path / "one.csv").read_bytes()
    assert one == (tmp_path / "two.csv").read_bytes()
    header, *rows = read_rows(tmp_path / "one.csv")
    assert header == ["image", "label", "probability"]
    with zipfile.ZipFile(test_images) as packed:
        expected = sorted(name[len("test/") :] for name in packed.namelist() if name.startswith("test/"))
    assert [row[0] for row in rows] == expected  # the top folder unwrapped, the junk left out, sorted as strings
    classes = inference.checkpoint_data(checkpoint)["classes"]
    assert all(row[1] in classes and 0 < float(row[2]) <= 1 for row in rows)
    if settings.DATASET != "synthetic":  # the sample's true labels are its folder names
        right = sum(row[0].split("/")[1] == row[1] for row in rows)
        assert right / len(rows) > 0.6


def test_images_decoded_by_two_loader_workers_per_process_give_the_same_file_as_by_none(
    project_root, checkpoint, tmp_path
):
    folder = write_image_folder(tmp_path / "test", ["a", "b", "c"], per_class=17)  # 51: 7 batches of 8, uneven
    args = ["--checkpoint", str(checkpoint), "--input", str(folder), "--probabilities", "--batch-size", "8"]
    args += ["--device", "cpu"]

    for workers in ("0", "2"):
        output = tmp_path / f"workers-{workers}.csv"
        run(["bash", "predict.sh", *args, "--workers", workers, "--output", str(output)], project_root, nproc=2)

    with_none = (tmp_path / "workers-0.csv").read_bytes()
    assert with_none == (tmp_path / "workers-2.csv").read_bytes()
    assert len(with_none.splitlines()) == 1 + 51


def test_a_sample_submission_sets_the_header_the_ids_and_the_row_order(project_root, checkpoint, test_images, tmp_path):
    with zipfile.ZipFile(test_images) as packed:
        ids = [Path(name).stem for name in packed.namelist() if name.startswith("test/")]
    random.Random(0).shuffle(ids)
    sample = tmp_path / "sample_submission.csv"
    sample.write_text("Id,Category\n" + "".join(f"{image_id},?\n" for image_id in ids[:40]), encoding="utf-8")
    output = tmp_path / "submission.csv"

    run(
        [sys.executable, "predict.py", "--checkpoint", str(checkpoint), "--input", str(test_images),
         "--sample-submission", str(sample), "--output", str(output)],
        project_root,
    )  # fmt: skip

    header, *rows = read_rows(output)
    assert header == ["Id", "Category"]
    assert [row[0] for row in rows] == ids[:40]
    assert all(row[1] in inference.checkpoint_data(checkpoint)["classes"] for row in rows)


def test_an_id_without_an_image_ends_in_one_line_and_writes_nothing_and_removes_its_extraction(
    project_root, checkpoint, test_images, tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where predict.py extracts the archive
    (tmp_path / "tmp").mkdir()
    sample = tmp_path / "sample_submission.csv"
    sample.write_text("id,label\nno-such-image,0\n", encoding="utf-8")
    output = tmp_path / "submission.csv"

    result = run(
        [sys.executable, "predict.py", "--checkpoint", str(checkpoint), "--input", str(test_images),
         "--sample-submission", str(sample), "--output", str(output)],
        project_root, check=False,
    )  # fmt: skip

    assert result.returncode == 1
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: 1 of the 1 IDs of {sample} have no input in --input (the first: 'no-such-image')"
    ]
    assert not output.exists()
    assert "extracting" in result.stderr + result.stdout  # (the test would pass if nothing had been extracted)
    assert not [path.name for path in (tmp_path / "tmp").iterdir() if path.is_dir()]


def test_two_processes_failing_right_after_extracting_say_one_line_and_leave_nothing_in_the_temporary_folder(
    project_root, checkpoint, test_images, tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where predict.py extracts the archive, and paddle logs
    (tmp_path / "tmp").mkdir()
    broken = tmp_path / checkpoint.name
    broken.write_bytes(b"not a checkpoint")  # every process stops at reading it, once the archive is extracted

    result = run(
        ["bash", "predict.sh", "--checkpoint", str(broken), "--input", str(test_images), "--output",
         str(tmp_path / "submission.csv")],
        project_root, nproc=2, check=False,
    )  # fmt: skip

    said = result.stdout + result.stderr
    errors = [line for line in said.splitlines() if "error:" in line]
    assert result.returncode != 0
    # (The checkpoint is read after the extraction: the line says every process got that far.)
    assert len(errors) == 1 and errors[0].startswith(f"error: checkpoint {broken} "), said[-3000:]
    # A process still extracting when another had ended used to fail on the removed folder, with a traceback.
    assert "Traceback" not in said, said[-3000:]
    assert not list((tmp_path / "tmp").glob("predict-*"))  # the extraction, and paddle's launcher logs


@pytest.mark.parametrize("broken", ["x-000.png", "x-001.png"])  # one in each process's share
def test_an_image_one_process_cannot_read_is_one_error_line_from_the_job_and_no_traceback(
    project_root, checkpoint, tmp_path, broken
):
    folder = write_image_folder(tmp_path / "test", ["x"], per_class=2) / "x"
    (folder / broken).write_bytes(b"not an image")

    result = run(
        ["bash", "predict.sh", "--checkpoint", str(checkpoint), "--input", str(folder), "--batch-size", "1",
         "--output", str(tmp_path / "submission.csv")],
        project_root, nproc=2, check=False,
    )  # fmt: skip

    said = result.stdout + result.stderr
    errors = [line for line in said.splitlines() if "error:" in line]
    assert result.returncode == 1
    assert len(errors) == 1 and errors[0].startswith(f"error: image {folder / broken} cannot be read"), said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert not (tmp_path / "submission.csv").exists()


def test_a_folder_without_images_is_one_line_from_two_processes(project_root, checkpoint, tmp_path):
    (tmp_path / "empty").mkdir()

    result = run(
        ["bash", "predict.sh", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "empty")],
        project_root, nproc=2, check=False,
    )  # fmt: skip

    said = result.stdout + result.stderr
    assert result.returncode == 1
    assert [line for line in said.splitlines() if "error:" in line] == [
        f"error: no images found under {tmp_path / 'empty'}: --input needs image files (.bmp, .gif, .jpeg, .jpg, "
        ".png, .tif, .tiff, .webp)"
    ], said[-3000:]


def test_an_output_that_cannot_be_written_is_one_line_naming_it_not_task_py(
    project_root, checkpoint, test_images, tmp_path
):
    (tmp_path / "a-file").write_text("kept")
    output = tmp_path / "a-file" / "submission.csv"

    result = run(
        ["bash", "predict.sh", "--checkpoint", str(checkpoint), "--input", str(test_images), "--output", str(output)],
        project_root, nproc=2, check=False,
    )  # fmt: skip

    said = result.stdout + result.stderr
    errors = [line for line in said.splitlines() if "error:" in line]
    assert result.returncode == 1
    assert len(errors) == 1, said
    assert errors[0].startswith(f"error: --output {output} cannot be written ("), said
    assert "Traceback" not in said and "task.py" not in said, said[-3000:]


def test_a_folder_of_images_is_read_where_it_is_its_lone_top_folder_unwrapped(project_root, checkpoint, tmp_path):
    folder = write_image_folder(tmp_path / "test" / "images", ["a", "b"], per_class=3)
    shutil.copyfile(folder / "a" / "a-000.png", folder / "._a-000.png")  # a resource fork: junk
    output = tmp_path / "out" / "predictions.csv"

    run([sys.executable, "predict.py", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "test"),
         "--output", str(output)], project_root)  # fmt: skip

    header, *rows = read_rows(output)
    assert header == ["image", "label"]
    assert [row[0] for row in rows] == [f"{name}/{name}-{index:03d}.png" for name in "ab" for index in range(3)]


def test_out_of_fold_accuracy_is_the_share_of_oof_csv_rows_whose_label_is_the_images_class(three_folds):
    output, _ = three_folds
    with open(output / "oof.csv", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    cv = json.loads((output / "cv.json").read_text(encoding="utf-8"))

    # An image's id is its path under the data folder: train/<class>/<file> (the sample's class folders).
    right = sum(row["image"].split("/")[1] == row["label"] for row in rows)
    assert cv["oof_acc"] == pytest.approx(right / len(rows), rel=1e-12)
