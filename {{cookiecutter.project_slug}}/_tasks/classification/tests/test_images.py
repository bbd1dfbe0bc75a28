"""Framework-free image data: junk is never an image, CSV labels, the held-out split, image shapes, bad files."""

import math
import traceback
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from {{ cookiecutter.project_slug }} import cli, data, images, seam, settings, task
from {{ cookiecutter.project_slug }}.errors import UserError

if settings.FRAMEWORK == "pytorch":
    import torch as framework
else:
    import paddle as framework


def write_png(path: Path, value=128, size: int = 8, mode: str = "L") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size), value).save(path)
    return path


def write_csv(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def relative(samples, root: Path) -> list[tuple[str, int]]:
    return [(path.relative_to(root).as_posix(), label) for path, label in samples]


def labelled_folder(root: Path, counts: dict[str, int]) -> Path:
    """root/images/<class>_<i>.png and root/labels.csv naming them, `counts[class]` images per class."""
    lines = ["image,label"]
    for name, count in counts.items():
        for i in range(count):
            write_png(root / "images" / f"{name}_{i:03d}.png", value=i % 256)
            lines.append(f"images/{name}_{i:03d}.png,{name}")
    write_csv(root / "labels.csv", lines)
    return root / "labels.csv"


def test_junk_and_hidden_files_are_never_read_as_images(tmp_path):
    write_png(tmp_path / "cat/0.png")
    write_png(tmp_path / "dog/1.png")
    (tmp_path / "cat/._0.png").write_bytes(b"\x00\x05\x16\x07 a resource fork, not a png")
    (tmp_path / "cat/.DS_Store").write_bytes(b"Bud1")
    (tmp_path / "dog/Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    write_png(tmp_path / "dog/.ipynb_checkpoints/1-checkpoint.png")
    write_png(tmp_path / "__MACOSX/cat/._0.png")

    samples, classes = images.scan_image_folder(tmp_path)

    assert classes == ["cat", "dog"]
    assert relative(samples, tmp_path) == [("cat/0.png", 0), ("dog/1.png", 1)]


def test_predict_reads_one_image_file_as_a_set_of_one_named_by_its_file_and_read_as_in_its_folder(tmp_path):
    for value, name in enumerate(["a.png", "b.png"]):
        write_png(tmp_path / "test" / name, value=60 * value)
    (tmp_path / "notes.txt").write_text("not an image\n", encoding="utf-8")

    in_folder, names = data.build_predict_set(tmp_path / "test", {})
    alone, [name] = data.build_predict_set(tmp_path / "test" / "b.png", {})

    assert names == ["a.png", "b.png"] and name == "b.png" and len(alone) == 1
    assert np.array_equal(np.asarray(alone[0]), np.asarray(in_folder[1]))
    with pytest.raises(UserError, match="is not an image, a folder of images or an archive"):
        data.build_predict_set(tmp_path / "notes.txt", {})


def test_class_folders_inside_one_top_folder_are_found(tmp_path):
    for split, name in (("train", "cat"), ("train", "dog"), ("val", "cat"), ("val", "dog")):
        write_png(tmp_path / "mydata" / split / name / f"{split}.png")
    (tmp_path / ".DS_Store").write_bytes(b"Bud1")

    splits = images.image_splits(tmp_path)

    assert splits.classes == ["cat", "dog"]
    assert relative(splits.train, tmp_path / "mydata") == [("train/cat/train.png", 0), ("train/dog/train.png", 1)]
    assert relative(splits.val, tmp_path / "mydata") == [("val/cat/val.png", 0), ("val/dog/val.png", 1)]


def test_a_data_folder_without_train_says_what_it_needs_in_one_line(tmp_path):
    write_png(tmp_path / "a.png")

    with pytest.raises(UserError, match="train") as error:
        images.image_splits(tmp_path)

    assert "--labels-csv" in str(error.value) and "\n" not in str(error.value)


def test_class_folders_without_val_hold_out_part_of_each_class(tmp_path):
    for name, count in (("cat", 20), ("dog", 10)):
        for i in range(count):
            write_png(tmp_path / "train" / name / f"{i:02d}.png")

    splits = images.image_splits(tmp_path, val_fraction=0.2, seed=3)

    val_labels = [label for _, label in splits.val]
    assert (val_labels.count(0), val_labels.count(1)) == (4, 2)
    assert len(splits.train) + len(splits.val) == 30
    assert not {path for path, _ in splits.train} & {path for path, _ in splits.val}


def test_csv_labels_give_classes_sorted_by_name_and_a_stratified_split(tmp_path):
    csv_file = labelled_folder(tmp_path, {"zebra": 30, "ant": 50, "moth": 7})

    splits = images.image_splits(tmp_path, csv_file, val_fraction=0.1, seed=0)

    assert splits.classes == ["ant", "moth", "zebra"]
    val_labels = [label for _, label in splits.val]
    assert [val_labels.count(label) for label in range(3)] == [5, 1, 3]  # 0.1 x 50, x 7 (at least 1), x 30
    assert len(splits.train) == 87 - 9
    # Each image keeps its own label.
    for path, label in splits.train + splits.val:
        assert path.name.startswith(splits.classes[label] + "_")


def test_the_held_out_split_is_the_same_for_a_seed_and_differs_for_another(tmp_path):
    csv_file = labelled_folder(tmp_path, {"a": 40, "b": 40})

    first = images.image_splits(tmp_path, csv_file, 0.25, seed=0)
    again = images.image_splits(tmp_path, csv_file, 0.25, seed=0)
    other = images.image_splits(tmp_path, csv_file, 0.25, seed=1)

    assert first == again
    assert sorted(first.val) != sorted(other.val)
    assert len(other.val) == len(first.val) == 20


def test_split_by_label_uses_no_global_random_state():
    np.random.seed(1)
    state = np.random.get_state()[1].copy()
    labels = [i % 3 for i in range(30)]

    train, val = images.split_by_label(labels, 0.3, seed=5)

    assert np.array_equal(np.random.get_state()[1], state)
    assert sorted(train + val) == list(range(30))
    assert images.split_by_label(labels, 0.3, seed=5) == (train, val)
    assert images.split_by_label(labels, 0.3, seed=-1)[1]  # a negative seed works too


def test_csv_rows_under_val_are_the_validation_split(tmp_path):
    lines = ["file,class"]
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            write_png(tmp_path / split / f"{name}.png")
            lines.append(f"{split}/{name}.png,{name}")
    csv_file = write_csv(tmp_path / "labels.csv", lines)

    splits = images.image_splits(tmp_path, csv_file)

    assert relative(splits.train, tmp_path) == [("train/cat.png", 0), ("train/dog.png", 1)]
    assert relative(splits.val, tmp_path) == [("val/cat.png", 0), ("val/dog.png", 1)]


def test_a_csv_inside_a_wrapped_archive_is_found_by_its_name_and_its_paths_read_from_there(tmp_path, monkeypatch):
    labelled_folder(tmp_path / "data" / "comp", {"a": 3, "b": 3})
    (tmp_path / "data" / "Thumbs.db").write_bytes(b"junk")
    monkeypatch.chdir(tmp_path)

    splits = images.image_splits(tmp_path / "data", "labels.csv", 0.5, seed=0)

    assert splits.classes == ["a", "b"]
    assert all(path.is_relative_to(tmp_path / "data" / "comp" / "images") for path, _ in splits.train + splits.val)


def test_a_missing_labels_file_says_where_it_was_looked_for(tmp_path):
    with pytest.raises(UserError, match="labels file nowhere.csv not found") as error:
        images.image_splits(tmp_path, "nowhere.csv")

    assert "--labels-csv" in str(error.value)


@pytest.mark.parametrize(
    "bad_line, says",
    [
        ("images/missing.png,cat", "missing.png not found"),
        ("images/cat_001.png,", "no label"),
        ("images/cat_001.png,   ", "no label"),
        ("images/cat_001.png", "no label"),
        (",cat", "no image path"),
    ],
)
def test_a_bad_csv_row_stops_with_one_line_naming_the_row(tmp_path, bad_line, says):
    csv_file = labelled_folder(tmp_path, {"cat": 3})
    lines = csv_file.read_text().splitlines()
    write_csv(csv_file, lines[:2] + [bad_line] + lines[2:])  # line 3 of the file

    with pytest.raises(UserError, match=says) as error:
        images.image_splits(tmp_path, csv_file)

    message = str(error.value)
    assert f"{csv_file} line 3 " in message
    assert repr(bad_line) in message
    assert "\n" not in message


def test_several_bad_rows_name_the_first_and_count_them(tmp_path):
    csv_file = labelled_folder(tmp_path, {"cat": 3})
    write_csv(csv_file, csv_file.read_text().splitlines() + ["", "gone.png,cat", "x.png,"])

    with pytest.raises(UserError, match="line 6 .*gone.png.*2 bad rows in all"):
        images.image_splits(tmp_path, csv_file)


def test_a_csv_without_two_columns_or_rows_is_refused(tmp_path):
    write_png(tmp_path / "a.png")
    with pytest.raises(UserError, match="header row and two columns"):
        images.image_splits(tmp_path, write_csv(tmp_path / "one.csv", ["image", "a.png"]))
    with pytest.raises(UserError, match="no rows"):
        images.image_splits(tmp_path, write_csv(tmp_path / "empty.csv", ["image,label"]))


def test_a_spreadsheets_byte_order_mark_and_windows_paths_are_read(tmp_path):
    rows = []
    for name, label in (("a", "x"), ("b", "x"), ("c", "y"), ("d", "y")):
        write_png(tmp_path / f"imgs/{name}.png")
        rows.append(f"imgs\\{name}.png,{label}")
    csv_file = tmp_path / "labels.csv"
    csv_file.write_bytes(("\ufeffimage,label\r\n" + "\r\n".join(rows) + "\r\n").encode())

    splits = images.image_splits(tmp_path, csv_file, 0.5)

    assert splits.classes == ["x", "y"]
    assert len(splits.train) == len(splits.val) == 2


def test_too_few_images_to_hold_any_out_says_so(tmp_path):
    csv_file = labelled_folder(tmp_path, {"a": 1, "b": 1})

    with pytest.raises(UserError, match="no validation images"):
        images.image_splits(tmp_path, csv_file)


@pytest.mark.parametrize("size, channels, mode", [(16, 3, "L"), (28, 1, "RGB"), (7, 3, "RGBA"), (32, 1, "P")])
def test_images_of_any_size_and_mode_load_at_the_asked_shape(tmp_path, size, channels, mode):
    path = tmp_path / "x.png"
    Image.new(mode, (40, 23), 200).save(path)

    pixels = images.load_image(path, size, channels)

    assert pixels.shape == (channels, size, size) and pixels.dtype == np.float32
    assert -1.0 <= pixels.min() <= pixels.max() <= 1.0


def test_pixels_are_normalised_with_mean_and_std(tmp_path):
    path = write_png(tmp_path / "x.png", value=(255, 255, 255), mode="RGB")

    assert np.allclose(images.load_image(path, 4), 1.0)
    assert np.allclose(images.load_image(path, 4, 3, mean=[0.0, 0.5, 1.0], std=0.5)[:, 0, 0], [2.0, 1.0, 0.0])


@pytest.mark.parametrize("content", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40])
def test_a_corrupt_image_raises_one_line_naming_the_file(tmp_path, content):
    path = tmp_path / "train/cat/broken.png"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)

    with pytest.raises(images.UnreadableImage) as error:
        images.load_image(path, 16)

    assert isinstance(error.value, UserError)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_truncated_image_names_the_file(tmp_path):
    whole = write_png(tmp_path / "whole.png", value=(10, 200, 30), size=64, mode="RGB").read_bytes()
    path = tmp_path / "cut.png"
    path.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(images.UnreadableImage, match="cut.png"):
        images.load_image(path, 16)


def test_an_unreadable_image_re_raised_by_a_data_loader_worker_keeps_its_one_line(tmp_path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"junk")
    try:
        images.load_image(path, 16)
    except images.UnreadableImage as error:
        original, worker_traceback = str(error), "".join(traceback.format_exception(error))
    # What torch's and paddle's DataLoader do with an error raised in a worker:
    rebuilt = images.UnreadableImage(
        f"Caught UnreadableImage in DataLoader worker process 0.\nOriginal {worker_traceback}"
    )

    assert str(rebuilt) == original


def test_synthetic_images_have_the_asked_channels_and_size():
    pixels, labels = images.synthetic_images(6, 3, 12, seed=0, channels=1)

    assert pixels.shape == (6, 1, 12, 12) and labels.shape == (6,)


@pytest.mark.parametrize(
    "flag, value", [("--val-fraction", "0"), ("--val-fraction", "1"), ("--channels", "2"), ("--image-size", "0")]
)
def test_impossible_data_flags_are_refused(flag, value, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args([flag, value])

    assert flag in capsys.readouterr().err


def test_data_flags_reach_args(tmp_path):
    args = cli.parse_args(
        ["--labels-csv", "train.csv", "--val-fraction", "0.2", "--image-size", "32", "--channels", "1"]
    )

    assert (args.labels_csv, args.val_fraction, args.image_size, args.channels) == ("train.csv", 0.2, 32, 1)
    assert cli.parse_args([]).val_fraction == 0.1


def test_model_option_width_widens_the_samples_hidden_layer_to_millions_of_parameters():
    from {{ cookiecutter.project_slug }}.model import build_model

    args = cli.parse_args(["--model-option", "width=4096"])
    task = seam.Task()
    wide = task.network(seam.data_description(object(), 10, task.chosen_options(args.model_option)))

    def parameters(model) -> int:
        return sum(math.prod(parameter.shape) for parameter in model.parameters())

    features = 64 * 4 * 4  # what the hidden layer reads: 64 channels pooled to 4 x 4
    assert parameters(wide) - parameters(build_model(10)) == (4096 - 128) * (features + 1 + 10)
    assert parameters(wide) > 4_000_000


def test_tta_averages_the_images_and_the_images_flipped_left_to_right():
    images = np.random.default_rng(0).standard_normal((4, 3, 5, 5)).astype(np.float32)
    batch = framework.from_numpy(images) if settings.FRAMEWORK == "pytorch" else framework.to_tensor(images)

    def top_left_pixel(batch):  # a network that looks at one corner: flipping changes what it sees
        return batch[:, :2, 0, 0]

    plain, flipped = task.test_time_views(top_left_pixel, batch)
    top_right = images[:, :2, 0, -1]
    expected = np.exp(top_right) / np.exp(top_right).sum(axis=1, keepdims=True)
    assert np.allclose(flipped, expected, atol=1e-6) and not np.allclose(plain, flipped)
