"""The segmentation task: images and masks in (data.py), a class index per pixel out (task.py, model.py).

Framework-neutral: the three files have the same public names in every framework's project.
"""

import argparse
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from {{ cookiecutter.project_slug }} import data, seam, settings, task
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.model import build_model

if settings.FRAMEWORK == "pytorch":
    import torch as framework

    def tensor(array: np.ndarray):
        return framework.from_numpy(np.ascontiguousarray(array))
else:
    import paddle as framework

    def tensor(array: np.ndarray):
        return framework.to_tensor(array)


def write_pair(root: Path, name: str, mask: np.ndarray, image_shape: tuple[int, int] | None = None) -> None:
    """root/images/<name>.png, random grey pixels, and root/masks/<name>.png, `mask` (as large unless told)."""
    for folder, pixels in (
        ("images", np.random.default_rng(len(name)).integers(0, 256, image_shape or mask.shape, dtype=np.uint8)),
        ("masks", mask.astype(np.uint8)),
    ):
        path = root / folder / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path)


def write_dataset(root: Path, count: int = 6, side: int = 8, largest: int = 2, val: bool = True) -> Path:
    """`count` pairs of random masks with indices 0..largest (each used), and as many under val/ if `val`."""
    rng = np.random.default_rng(0)
    for split in ("", "val") if val else ("",):
        for index in range(count):
            mask = rng.integers(0, largest + 1, (side, side))
            mask.flat[: largest + 1] = np.arange(largest + 1)
            write_pair(root / split, f"{index:03d}", mask)
    return root


def options(root: Path, **flags) -> argparse.Namespace:
    """run.py's data flags, at their defaults unless `flags` say otherwise."""
    defaults = dict(synthetic=False, seed=0, val_fraction=0.25, image_size=None, channels=None, num_classes=None)
    return argparse.Namespace(data_dir=str(root), **{**defaults, **flags})


def one_line_error(root: Path, **flags) -> str:
    with pytest.raises(UserError) as raised:
        data.build_datasets(options(root, **flags))
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_the_class_count_is_the_largest_training_index_plus_one_unless_num_classes_says_more(tmp_path):
    root = write_dataset(tmp_path, largest=2)

    assert data.build_datasets(options(root))[2] == 3
    assert data.build_datasets(options(root, num_classes=5))[2] == 5


def test_images_and_masks_come_at_image_size_with_masks_resized_to_class_indices_only(tmp_path):
    mask = np.kron(np.array([[0, 7], [3, 0]]), np.ones((5, 5), dtype=np.int64))  # 10x10, four blocks
    write_pair(tmp_path, "a", mask)
    write_pair(tmp_path / "val", "b", mask)

    train, _, num_classes = data.build_datasets(options(tmp_path, image_size=4, channels=1))
    image, resized = (np.asarray(part) for part in train[0])

    assert num_classes == 8 and image.shape == (1, 4, 4) and image.dtype == np.float32
    # Nearest neighbour: the blocks shrink, and no pixel gets an index that blends two of them.
    assert resized.tolist() == [[0, 0, 7, 7], [0, 0, 7, 7], [3, 3, 0, 0], [3, 3, 0, 0]]


@pytest.mark.parametrize(
    "spoil, named",
    [
        (lambda root: (root / "images" / "002.png").unlink(), "masks/002.png has no image"),
        (lambda root: (root / "val" / "masks" / "001.png").unlink(), "images/001.png has no mask"),
        (lambda root: write_pair(root, "002", np.zeros((8, 8)), image_shape=(8, 9)), "masks/002.png is 8x8 pixels"),
        (lambda root: write_pair(root / "val", "003", np.full((8, 8), 9)), "masks/003.png holds class index 9"),
        (lambda root: Image.new("RGB", (8, 8)).save(root / "masks" / "001.png"), "masks/001.png is a RGB image"),
        (lambda root: (root / "masks" / "004.png").write_bytes(b"not a png"), "masks/004.png cannot be read"),
    ],
    ids=["mask-without-image", "image-without-mask", "other-size", "index-too-large", "rgb-mask", "damaged-mask"],
)
def test_bad_data_stops_with_one_line_naming_the_file(tmp_path, spoil, named):
    root = write_dataset(tmp_path)
    spoil(root)

    assert named in one_line_error(root)


def test_an_index_beyond_num_classes_names_the_mask_and_the_flag(tmp_path):
    root = write_dataset(tmp_path, largest=3)

    message = one_line_error(root, num_classes=2)

    assert "masks/000.png holds class index 3" in message and "--num-classes" in message


def test_the_ignore_index_is_no_class_and_masks_of_nothing_but_0_and_it_are_one_line_saying_what_to_do(tmp_path):
    root = write_dataset(tmp_path / "bordered", largest=2)
    for mask_path in (root / "masks").glob("*.png"):
        mask = np.array(Image.open(mask_path))
        mask[0, :] = data.IGNORE_INDEX  # an object border, as VOC draws it
        Image.fromarray(mask).save(mask_path)
    binary = tmp_path / "binary"
    for index in range(4):
        write_pair(binary, f"{index:03d}", np.where(np.arange(64).reshape(8, 8) % (index + 2), 0, 255))

    assert data.build_datasets(options(root))[2] == 3
    assert "binary masks saved as 0 and 255? Save them as 0 and 1" in one_line_error(binary)


def test_without_val_a_fraction_is_held_out_the_same_for_a_seed_and_another_for_another(tmp_path):
    root = write_dataset(tmp_path, count=20, val=False)

    def split(seed: int) -> tuple[list, list]:
        train, val, _ = data.build_datasets(options(root, seed=seed))
        return [image.name for image, _ in train.pairs], [image.name for image, _ in val.pairs]

    train, val = split(0)
    assert len(val) == 5 and sorted(train + val) == [f"{index:03d}.png" for index in range(20)]
    assert split(0) == (train, val)
    assert split(1)[1] != val


class FixedScores:
    """A stand-in network: the scores it is given, batch after batch."""

    def __init__(self, scores: np.ndarray):
        self.scores, self.given = scores, 0

    def __call__(self, images):
        batch = self.scores[self.given : self.given + images.shape[0]]
        self.given += images.shape[0]
        return tensor(batch)


def test_miou_from_batches_summed_equals_a_count_over_every_pixel_of_the_classes_seen(tmp_path):
    rng = np.random.default_rng(0)
    num_classes, count = 5, 7  # class 4 is in no mask and never predicted: it does not count
    masks = rng.integers(0, 4, (count, 6, 6))
    scores = rng.normal(size=(count, num_classes, 6, 6)).astype(np.float32)
    scores[:, 4] = -100.0
    model = FixedScores(scores)

    contributions = []
    for number, start in enumerate(range(0, count, 3)):  # batches of 3, 3 and 1
        batch = (tensor(np.zeros((min(3, count - start), 1, 6, 6), np.float32)), tensor(masks[start : start + 3]))
        sums, _ = task.validation_step(model, batch)
        contributions.append((number, {name: np.asarray(value, np.float64) for name, value in sums.items()}, {}))
    results = seam.Task(task=task).metrics(contributions, count)

    predicted = scores.argmax(axis=1)
    ious = [
        np.sum((masks == label) & (predicted == label)) / np.sum((masks == label) | (predicted == label))
        for label in range(4)
    ]
    assert results["miou"] == pytest.approx(np.mean(ious), rel=1e-12)
    assert results["pixel_acc"] == pytest.approx(np.mean(masks == predicted), rel=1e-12)
    log_probabilities = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
    picked = np.take_along_axis(log_probabilities, masks[:, None], axis=1)
    assert results["loss"] == pytest.approx(-picked.mean(), rel=1e-5)


def test_ignored_pixels_count_in_neither_the_loss_nor_the_metrics(tmp_path):
    rng = np.random.default_rng(1)
    masks = rng.integers(0, 3, (4, 6, 6))
    masks[:, 0, :] = data.IGNORE_INDEX
    masks[3] = data.IGNORE_INDEX  # an image with no pixel to learn from
    scores = rng.normal(size=(4, 3, 6, 6)).astype(np.float32)
    batch = (tensor(np.zeros((4, 1, 6, 6), np.float32)), tensor(masks))

    sums, _ = task.validation_step(FixedScores(scores), batch)
    loss = float(task.training_loss(FixedScores(scores), batch))

    kept = masks != data.IGNORE_INDEX
    log_probabilities = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
    picked = np.take_along_axis(log_probabilities, np.where(kept, masks, 0)[:, None], axis=1)[:, 0]
    per_image = [-picked[image][kept[image]].mean() if kept[image].any() else 0.0 for image in range(4)]
    confusion = np.zeros((3, 3), np.int64)
    np.add.at(confusion, (masks[kept], scores.argmax(axis=1)[kept]), 1)
    assert float(sums["loss"]) == pytest.approx(sum(per_image), rel=1e-5)
    assert np.array_equal(np.asarray(sums["confusion"]), confusion)
    assert loss == pytest.approx(-picked[kept].mean(), rel=1e-5)


def test_a_checkpoints_description_reads_new_images_as_training_read_them(tmp_path):
    root = write_dataset(tmp_path)
    train, _, num_classes = data.build_datasets(options(root, image_size=12, channels=1))
    description = seam.data_description(train, num_classes)

    inputs, keys = data.build_predict_set(root / "images", description)

    assert description["classes"] == ["0", "1", "2"] and description["channels"] == 1
    assert keys[0] == ("000.png", (8, 8))
    assert np.array_equal(np.asarray(inputs[0]), np.asarray(train[0][0]))
    network = build_model(num_classes, **seam.Task().model_options(description))
    network.eval()
    assert tuple(network(tensor(np.asarray(inputs[0])[None])).shape) == (1, 3, 12, 12)


def test_one_image_file_is_predicted_as_a_set_of_one_keyed_by_its_file_and_read_as_in_its_folder(tmp_path):
    root = write_dataset(tmp_path)
    in_folder, keys = data.build_predict_set(root / "images", {})

    alone, [key] = data.build_predict_set(root / "images" / keys[1][0], {})

    assert key == keys[1] and len(alone) == 1
    assert np.array_equal(np.asarray(alone[0]), np.asarray(in_folder[1]))


def test_a_training_folder_given_to_predict_is_one_line_naming_its_images_not_its_masks_read_as_images(tmp_path):
    root = write_dataset(tmp_path)

    with pytest.raises(UserError) as error:
        data.build_predict_set(root, {})

    assert f"--input {root / 'images'}" in str(error.value) and "\n" not in str(error.value)


def test_the_network_scores_every_pixel_of_images_of_any_side():
    network = build_model(4, channels=3)
    network.eval()

    scores = network(tensor(np.zeros((2, 3, 30, 21), np.float32)))

    assert tuple(scores.shape) == (2, 4, 30, 21)


def test_predictions_are_8_bit_masks_at_each_images_own_size_under_its_relative_path(tmp_path):
    keys = [("a/x.jpg", (6, 3)), ("y.png", (2, 2))]
    rows = [np.array([[0, 1], [2, 1]], np.uint8), np.array([[3, 0], [0, 3]], np.uint8)]

    written = Path(task.write_predictions(str(tmp_path / "masks"), keys, rows, {}, argparse.Namespace()))

    assert sorted(path.relative_to(written).as_posix() for path in written.rglob("*")) == ["a", "a/x.png", "y.png"]
    with Image.open(written / "a" / "x.png") as mask:
        assert mask.mode == "L" and mask.size == (6, 3)
        assert np.asarray(mask).tolist() == [[0, 0, 0, 1, 1, 1], [2, 2, 2, 1, 1, 1], [2, 2, 2, 1, 1, 1]]
    with Image.open(written / "y.png") as mask:
        assert np.asarray(mask).tolist() == [[3, 0], [0, 3]]


def test_predict_refuses_images_that_would_write_the_same_mask(tmp_path):
    for name in ("a.png", "a.jpg"):
        Image.new("L", (4, 4)).save(tmp_path / name)

    with pytest.raises(UserError, match="a.jpg and .*a.png differ only in their suffix"):
        data.build_predict_set(tmp_path, {})


def test_synthetic_data_marks_the_squares_it_draws_brighter_for_the_higher_class(tmp_path):
    train, val, num_classes = data.build_datasets(options(tmp_path / "none", synthetic=True, channels=1))
    images, masks = (np.stack([np.asarray(train[index][part]) for index in range(20)]) for part in (0, 1))

    assert num_classes == 3 and len(val) > 0 and masks.shape == (20, *images.shape[2:])
    assert images[:, 0][masks == 2].mean() > images[:, 0][masks == 1].mean() > images[:, 0][masks == 0].mean()


# Predicted masks as written to a CSV: three images, the last with nothing found; each at its own size.
CSV_KEYS = [("a/x.jpg", (6, 3)), ("y.png", (2, 2)), ("z.png", (3, 1))]
CSV_ROWS = [np.array([[0, 1], [2, 1]], np.uint8), np.array([[2, 0], [0, 2]], np.uint8), np.zeros((1, 1), np.uint8)]
CLASSES = {"classes": ["0", "1", "2"]}


def decoded(rle: str, shape: tuple[int, int], order: str) -> np.ndarray:
    """A run-length encoded mask's pixels: `start length` pairs numbered from 1 down the columns or along the rows."""
    pixels = np.zeros(shape[0] * shape[1], bool)
    numbers = [int(number) for number in rle.split()]
    for start, length in zip(numbers[::2], numbers[1::2], strict=True):
        pixels[start - 1 : start - 1 + length] = True
    return pixels.reshape(shape, order="F" if order == "column" else "C")


def read_rows(path: str) -> list[list[str]]:
    return [line.split(",") for line in Path(path).read_text(encoding="utf-8").splitlines()]


def test_a_csv_output_is_a_file_of_a_row_per_image_and_class_found_and_an_empty_one_for_an_image_with_none(tmp_path):
    written = task.write_predictions(str(tmp_path / "sub.csv"), CSV_KEYS, CSV_ROWS, CLASSES, argparse.Namespace())

    assert Path(written).is_file()
    assert [row[:2] for row in read_rows(written)] == [
        ["id", "class"], ["a/x.jpg", "1"], ["a/x.jpg", "2"], ["y.png", "2"], ["z.png", ""]
    ]  # fmt: skip
    assert read_rows(written)[-1] == ["z.png", "", ""]


@pytest.mark.parametrize("order", ["column", "row"])
def test_the_csv_decodes_to_exactly_the_png_masks_of_a_folder_output(tmp_path, order):
    folder = Path(task.write_predictions(str(tmp_path / "masks"), CSV_KEYS, CSV_ROWS, CLASSES, argparse.Namespace()))
    options = argparse.Namespace(rle_order=None if order == "column" else order)
    written = task.write_predictions(str(tmp_path / "sub.csv"), CSV_KEYS, CSV_ROWS, CLASSES, options)

    masks = {}
    for name, label, rle in read_rows(written)[1:]:
        with Image.open(folder / Path(name).with_suffix(".png")) as png:
            expected = masks.setdefault(name, (np.asarray(png), np.zeros(png.size[::-1], np.uint8)))[0]
        masks[name][1][decoded(rle, expected.shape, order)] = int(label or 0)
    assert len(masks) == 3 and all(np.array_equal(png, mask) for png, mask in masks.values())


def test_a_sample_submission_is_followed_by_image_and_class_and_by_image_alone_for_two_classes(tmp_path):
    sample = tmp_path / "sample.csv"
    sample.write_text("ImageId,ClassId,EncodedPixels\ny,2,\nx.jpg,1,\nz,1,\ny.png,1,\n", encoding="utf-8")
    options = argparse.Namespace(sample_submission=str(sample))

    written = task.write_predictions(str(tmp_path / "sub.csv"), CSV_KEYS, CSV_ROWS, CLASSES, options)

    assert read_rows(written) == [
        ["ImageId", "ClassId", "EncodedPixels"], ["y", "2", "1 1 4 1"], ["x.jpg", "1", "10 9"], ["z", "1", ""],
        ["y.png", "1", ""],
    ]  # fmt: skip
    sample.write_text("img,rle_mask\nz,\ny.png,\n", encoding="utf-8")  # one class and the background: by image
    binary = [(row > 0).astype(np.uint8) for row in CSV_ROWS]
    written = task.write_predictions(str(tmp_path / "two.csv"), CSV_KEYS, binary, {"classes": ["0", "1"]}, options)
    assert read_rows(written) == [["img", "rle_mask"], ["z", ""], ["y.png", "1 1 4 1"]]


@pytest.mark.parametrize(
    "flags, output, named",
    [
        ({"rle_order": "row"}, "masks", "--rle-order is for a CSV"),
        ({"sample_submission": "sample.csv"}, "masks", "--sample-submission is for a CSV"),
        ({}, "taken.csv", "--output .*taken.csv is a folder"),
    ],
    ids=["rle-order-with-a-folder", "sample-with-a-folder", "csv-that-is-a-folder"],
)
def test_a_csv_option_with_a_folder_output_or_a_folder_named_csv_ends_in_one_line(tmp_path, flags, output, named):
    (tmp_path / "taken.csv").mkdir()

    with pytest.raises(UserError, match=named):
        task.write_predictions(str(tmp_path / output), CSV_KEYS, CSV_ROWS, CLASSES, argparse.Namespace(**flags))


def test_masks_are_not_written_into_a_folder_that_holds_an_earlier_predictions_masks(tmp_path):
    earlier = Path(task.write_predictions(str(tmp_path / "masks"), CSV_KEYS, CSV_ROWS, CLASSES, argparse.Namespace()))
    before = {path: path.read_bytes() for path in earlier.rglob("*") if path.is_file()}

    with pytest.raises(UserError, match="is a folder that is not empty"):
        task.write_predictions(str(earlier), CSV_KEYS[:1], CSV_ROWS[:1], CLASSES, argparse.Namespace())

    assert {path: path.read_bytes() for path in earlier.rglob("*") if path.is_file()} == before


def test_tta_flips_the_images_and_flips_the_predicted_masks_back():
    images = np.random.default_rng(0).standard_normal((2, 3, 6, 8)).astype(np.float32)

    def first_two_channels(batch):  # a network that scores each pixel by its own values: flipping commutes with it
        return batch[:, :2]

    plain = task.predict_outputs(first_two_channels, tensor(images))
    views = task.test_time_views(first_two_channels, tensor(images))

    assert len(views) == 2 and all(np.allclose(view, plain) for view in views)  # the flipped view's masks undone
