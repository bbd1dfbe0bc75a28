"""The sample task's (image classification's) build_datasets() on data as people pack it: a wrapped archive with
junk, a flat folder with a CSV. A task of your own replaces these tests with its own.

Framework-neutral: data.py has the same public names in every framework's project.
"""

import collections
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ARCHIVE_JUNK, copy_of_project, write_image_folder
from PIL import Image

from {{ cookiecutter.project_slug }} import archive, cli, data, folds, settings, workspace
from {{ cookiecutter.project_slug }}.errors import UserError


@pytest.fixture(scope="module")
def sample_archive(tmp_path_factory) -> Path:
    """The sample archive (dataset=zip), or one made from the sample folder (folder) or from made-up images."""
    if settings.DATASET == "zip":
        return workspace.SAMPLE_ARCHIVE
    folder = cli.SAMPLE_DATA_DIR
    if settings.DATASET == "synthetic":  # no sample data: images made up in its layout, 10 classes
        folder = tmp_path_factory.mktemp("made_up")
        classes = [str(digit) for digit in range(10)]
        write_image_folder(folder / "train", classes, per_class=12, seed=1)
        write_image_folder(folder / "val", classes, per_class=3, seed=2, first=100)
    path = tmp_path_factory.mktemp("sample") / "digits.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for image in sorted(folder.rglob("*.png")):
            zf.write(image, image.relative_to(folder).as_posix())
    return path


@pytest.fixture(scope="module")
def sample_images(sample_archive) -> int:
    with zipfile.ZipFile(sample_archive) as zf:
        return sum(1 for name in zf.namelist() if name.endswith(".png"))


@pytest.fixture(scope="module")
def sample_dir(sample_archive, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("original") / "digits"
    archive.ensure_extracted(sample_archive, target, show_progress=False)
    return target


@pytest.fixture(scope="module")
def flat_sample(sample_dir, tmp_path_factory) -> Path:
    """The sample images in one folder, their labels in train.csv beside it: how competitions ship data."""
    root = tmp_path_factory.mktemp("flat") / "comp"
    (root / "images").mkdir(parents=True)
    lines = ["image,label"]
    for image in sorted(sample_dir.glob("*/*/*.png")):
        shutil.copyfile(image, root / "images" / image.name)
        lines.append(f"images/{image.name},{image.parent.name}")
    (root / "train.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def args_for(*argv: str):
    """run.py's flags; the data given, not the synthetic default of a dataset=synthetic project."""
    return cli.parse_args(["--no-synthetic", *argv] if "--synthetic" not in argv else list(argv))


def as_array(image) -> np.ndarray:
    return np.asarray(image.numpy() if hasattr(image, "numpy") else image)


def contents(dataset, root: Path) -> list[tuple[str, int]]:
    """(path relative to the data root, label) of every sample."""
    return [(path.relative_to(root).as_posix(), label) for path, label in dataset.samples]


def test_a_repacked_archive_with_a_top_folder_and_junk_loads_the_same_images(
    sample_archive, sample_dir, sample_images, tmp_path
):
    repacked = tmp_path / "mydata.zip"
    with zipfile.ZipFile(sample_archive) as original, zipfile.ZipFile(repacked, "w") as zf:
        for name in original.namelist():
            zf.writestr(f"digits/{name}", original.read(name))
        for name, content in ARCHIVE_JUNK.items():  # beside the top folder and inside it
            zf.writestr(name, content)
            zf.writestr(f"digits/{name}", content)
    target = tmp_path / "mydata"
    archive.ensure_extracted(repacked, target, show_progress=False)

    original_train, original_val, classes = data.build_datasets(args_for("--data-dir", str(sample_dir)))
    train, val, num_classes = data.build_datasets(args_for("--data-dir", str(target)))

    assert num_classes == classes == 10
    assert contents(train, target / "digits") == contents(original_train, sample_dir)
    assert contents(val, target / "digits") == contents(original_val, sample_dir)
    assert len(train) + len(val) == sample_images
    for index in (0, len(train) - 1):
        assert np.array_equal(as_array(train[index][0]), as_array(original_train[index][0]))
    on_disk = {path.name for path in target.rglob("*")}
    assert not on_disk & {"__MACOSX", ".DS_Store", "Thumbs.db", "._0.png", "cat"}


def test_a_flat_folder_with_a_labels_csv_gives_the_same_classes_and_a_stratified_split(
    sample_dir, sample_images, flat_sample
):
    train, val, num_classes = data.build_datasets(
        args_for("--data-dir", str(flat_sample), "--labels-csv", str(flat_sample / "train.csv"))
    )
    folder_train, _, _ = data.build_datasets(args_for("--data-dir", str(sample_dir)))

    assert train.classes == val.classes == folder_train.classes == [str(digit) for digit in range(10)]
    assert num_classes == 10
    assert len(train) + len(val) == sample_images
    all_labels = [label for _, label in train.samples + val.samples]
    val_labels = [label for _, label in val.samples]
    for label in range(10):
        assert val_labels.count(label) == round(all_labels.count(label) * 0.1)  # (0.1 of 179 or 180: 18)
    assert not {path for path, _ in train.samples} & {path for path, _ in val.samples}


def test_the_csv_split_is_the_same_on_every_call_for_a_seed_and_another_for_another_seed(flat_sample):
    def val_images(seed: str, fraction: str = "0.1") -> list[str]:
        argv = ["--data-dir", str(flat_sample), "--labels-csv", "train.csv", "--seed", seed, "--val-fraction", fraction]
        _, val, _ = data.build_datasets(args_for(*argv))
        return [path.name for path, _ in val.samples]

    first = val_images("0")

    assert val_images("0") == first
    assert val_images("1") != first and len(val_images("1")) == len(first)
    assert len(val_images("0", "0.25")) > len(first)


def test_a_bad_csv_row_ends_in_one_line_naming_it(flat_sample, tmp_path):
    lines = (flat_sample / "train.csv").read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([*lines[:10], "images/9999.png,7", *lines[10:]]) + "\n")

    with pytest.raises(UserError) as error:
        data.build_datasets(args_for("--data-dir", str(flat_sample), "--labels-csv", str(bad)))

    assert f"{bad} line 11 ('images/9999.png,7')" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("size, channels", [(16, 3), (28, 1), (9, 3)])
def test_image_size_and_channels_shape_every_image(sample_dir, size, channels):
    train, val, _ = data.build_datasets(
        args_for("--data-dir", str(sample_dir), "--image-size", str(size), "--channels", str(channels))
    )

    for dataset in (train, val):
        assert as_array(dataset[0][0]).shape == (channels, size, size)
        assert (dataset.image_size, dataset.channels) == (size, channels)


def test_the_defaults_suit_the_sample_data(sample_dir):
    train, _, _ = data.build_datasets(args_for("--data-dir", str(sample_dir)))

    assert as_array(train[0][0]).shape == (data.CHANNELS, data.IMAGE_SIZE, data.IMAGE_SIZE) == (3, 16, 16)


@pytest.mark.parametrize("size, channels", [(16, 3), (24, 1)])
def test_synthetic_data_follows_image_size_and_channels(size, channels):
    train, val, num_classes = data.build_datasets(
        args_for("--synthetic", "--image-size", str(size), "--channels", str(channels))
    )

    assert as_array(train[0][0]).shape == as_array(val[0][0]).shape == (channels, size, size)
    assert train.classes == [str(label) for label in range(num_classes)]
    assert (train.image_size, train.channels) == (size, channels)


def test_the_sets_carry_what_a_checkpoint_records(sample_dir):
    from {{ cookiecutter.project_slug }}.seam import data_description

    train, val, num_classes = data.build_datasets(args_for("--data-dir", str(sample_dir), "--channels", "1"))

    description = data_description(train, num_classes)
    assert description == data_description(val, num_classes)
    assert description == {
        "classes": [str(digit) for digit in range(10)],
        "image_size": data.IMAGE_SIZE,
        "channels": 1,
        "mean": 0.5,
        "std": 0.5,
        "num_classes": 10,
    }


def test_args_without_the_new_flags_still_build(sample_dir, sample_images):
    from types import SimpleNamespace

    train, val, _ = data.build_datasets(SimpleNamespace(synthetic=False, data_dir=str(sample_dir), seed=0))

    assert (train.image_size, train.channels) == (data.IMAGE_SIZE, data.CHANNELS)
    assert len(train) + len(val) == sample_images


def folder_with_a_corrupt_image(root: Path) -> Path:
    from PIL import Image

    for split in ("train", "val"):
        for name in ("cat", "dog"):
            for i in range(4):
                (root / split / name).mkdir(parents=True, exist_ok=True)
                Image.new("L", (8, 8), 30 * i).save(root / split / name / f"{i}.png")
    broken = root / "train/dog/2.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    return broken


LOAD_EVERY_BATCH = """
import sys
from types import SimpleNamespace

from {{ cookiecutter.project_slug }} import batches, cli, data, loaders
from {{ cookiecutter.project_slug }}.errors import explain_user_errors

ONE_PROCESS = SimpleNamespace(rank=0, local_rank=0, world_size=1, on_gpu=False, is_main=True)


@explain_user_errors
def load(args):
    train, val, _ = data.build_datasets(args)
    train_loader, _ = loaders.build_loaders(train, val, 3, args.workers, 0, ONE_PROCESS)
    for batch in train_loader:
        batches.sample_count(batch)  # as the loops read each batch


load(cli.parse_args(sys.argv[1:]))
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_corrupt_image_met_while_loading_ends_in_one_line_naming_it(project_root, tmp_path, workers):
    broken = folder_with_a_corrupt_image(tmp_path / "data")
    command = [sys.executable, "-c", LOAD_EVERY_BATCH, "--no-synthetic", "--data-dir", str(tmp_path / "data")]
    command += ["--workers", workers]

    # A subprocess, as run.py is.
    result = subprocess.run(command, cwd=project_root, capture_output=True, text=True, timeout=120)

    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert str(broken) in errors[0] and "cannot be read" in errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_training_run_that_meets_a_corrupt_image_stops_with_one_error_line(project_root, tmp_path, workers):
    broken = folder_with_a_corrupt_image(tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    command = [sys.executable, "run.py", "--no-synthetic", "--data-dir", str(tmp_path / "data")]
    command += ["--output-dir", str(tmp_path / "out")]
    command += ["--epochs", "1", "--device", "cpu", "--workers", workers, "--batch-size", "2"]

    result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(broken) in errors[0], result.stderr[-3000:]


OWN_DATASETS = """

_build_datasets = build_datasets


def build_datasets(args):  # noqa: F811 - a test gives the project datasets of its own, not the sample's
    args.synthetic = True
    return _build_datasets(args)
"""


@pytest.mark.slow
@pytest.mark.parametrize("named", [False, True], ids=["no archive named", "an archive named"])
def test_a_project_with_its_own_datasets_never_extracts_the_sample_but_always_a_named_archive(
    project_root, tmp_path, sample_archive, named
):
    project = copy_of_project(project_root, tmp_path / "project", ignore=("digits",), data=OWN_DATASETS)
    theirs = tmp_path / "theirs.zip"
    shutil.copyfile(sample_archive, theirs)
    command = [sys.executable, "run.py", "--epochs", "1", "--device", "cpu", "--output-dir", str(tmp_path / "out")]
    command += ["--dataset-zip", str(theirs)] if named else []
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}

    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    assert not (project / "data" / "digits").exists()
    assert (tmp_path / "theirs" / archive.DONE_MARKER).is_file() == named


def test_folds_of_a_labels_csv_keep_each_group_of_its_group_column_in_one_fold(tmp_path):
    (tmp_path / "images").mkdir()
    lines = ["image,label,patient"]
    for index in range(24):
        label = "ab"[index % 2]
        Image.fromarray(np.full((4, 4), index * 10, dtype=np.uint8)).save(tmp_path / "images" / f"{index:02d}.png")
        lines.append(f"images/{index:02d}.png,{label},p{index % 6}")
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    flags = ["--data-dir", str(tmp_path), "--labels-csv", "labels.csv", "--folds", "3", "--group-column"]

    labeled = data.build_labeled_set(cli.parse_args([*flags, "patient"]))
    fold_of = folds.assign(labeled.strata, labeled.groups, 3, seed=0)

    assert labeled.groups == [f"p{index % 6}" for index in range(24)]
    folds_of = collections.defaultdict(set)
    for fold, group in zip(fold_of, labeled.groups, strict=True):
        folds_of[group].add(fold)
    assert len(folds_of) == 6 and all(len(one) == 1 for one in folds_of.values())
    with pytest.raises(UserError, match="no column 'site'"):
        data.build_labeled_set(cli.parse_args([*flags, "site"]))
