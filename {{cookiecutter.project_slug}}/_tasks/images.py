"""Framework-free image data, the image tasks' (data.py's): which images, which labels, which split; reading one
image; synthetic images; the datasets predict.py reads.

Pillow + numpy only, so it works wherever the framework does (no torchvision).
Two layouts are read, both under the data root (--data-dir, or the one folder
it wraps: see archive.dataset_root):

- folders: train/<class>/* and val/<class>/*;
- a labels CSV (--labels-csv): a header row, then `image path relative to the
  data root, class name` per row.

Without a validation split (no val/ folder; no CSV row under val/), a fraction
of each class is held out (batches.split_by_label()), the same on every rank and every
run for a given seed. Classes are sorted by name; a sample is (path, class index).
"""

import csv
import functools
import logging
from pathlib import Path, PurePosixPath
from typing import NamedTuple

import numpy as np
from PIL import Image

from .archive import dataset_root, is_junk
from .batches import split_by_label, val_count  # noqa: F401 (val_count: the first versions' data.py imports it here)
from .errors import UserError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
# Pixels are scaled to [0, 1], then normalised as (x - MEAN) / STD: [-1, 1] for these values.
MEAN, STD = 0.5, 0.5
VAL_FRACTION = 0.1

Sample = tuple[Path, int]


class Splits(NamedTuple):
    train: list[Sample]
    val: list[Sample]
    classes: list[str]


class UnreadableImage(UserError):
    """A file that is not a readable image; its message names the file.

    DataLoader workers (PyTorch's and Paddle's) re-raise an error in the main
    process as type(error)(a header + the worker's traceback): the last line of
    that traceback is "module.UnreadableImage: <our message>", which is kept, so
    the run still ends with one line.
    """

    def __init__(self, message: str):
        lines = message.strip().splitlines()
        if len(lines) > 1:
            message = lines[-1].split(": ", 1)[-1]
        super().__init__(message)


def is_image_file(path: Path, root: Path) -> bool:
    """An image file under root, not junk (._x.png is not an image) and not in a hidden folder."""
    relative = path.relative_to(root)
    return (
        path.suffix.lower() in IMAGE_EXTENSIONS
        and not is_junk(relative)
        and not any(part.startswith(".") for part in relative.parts)
        and path.is_file()
    )


def find_images(root: str | Path) -> list[Path]:
    """Every image under root, at any depth, sorted by path (junk and hidden files left out)."""
    root = Path(root)
    return sorted(path for path in root.rglob("*") if is_image_file(path, root))


def scan_image_folder(root: str | Path) -> tuple[list[Sample], list[str]]:
    """List (path, class index) for every image under root/<class>/, classes sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"data folder {root} not found: pass --data-dir with train/<class>/ and val/<class>/ inside")
    classes = sorted(
        entry.name
        for entry in root.iterdir()
        if entry.is_dir() and not entry.name.startswith(".") and not is_junk(entry.name)
    )
    samples = [(path, label) for label, name in enumerate(classes) for path in find_images(root / name)]
    if not samples:
        raise UserError(f"no images found in {root}: expected {root}/<class>/<image>.png")
    return samples, classes


def image_splits(
    data_dir: str | Path, labels_csv: str | Path | None = None, val_fraction: float = VAL_FRACTION, seed: int = 0
) -> Splits:
    """The training and validation samples under data_dir, from class folders or from a labels CSV: val/'s, or
    without a val/ split a held-out part of each class."""
    samples, classes, in_val, _ = labelled_images(data_dir, labels_csv)
    if any(in_val):
        return Splits(
            [s for s, v in zip(samples, in_val, strict=True) if not v],
            [s for s, v in zip(samples, in_val, strict=True) if v],
            classes,
        )
    return held_out(samples, classes, val_fraction, seed)


def labelled_images(data_dir: str | Path, labels_csv: str | Path | None = None) -> tuple:
    """Every labelled image under data_dir (train and val together) with its class index, the class names,
    whether each is in the validation split (under val/), and the data's root (what the paths are under)."""
    if labels_csv:
        return csv_images(data_dir, labels_csv)
    root = dataset_root(data_dir, "train")
    if not (root / "train").is_dir():
        raise UserError(
            f"data folder {root / 'train'} not found: --data-dir needs train/<class>/ (and val/<class>/) inside, "
            "or one folder holding them; for images labelled by a CSV file pass --labels-csv"
        )
    train, classes = scan_image_folder(root / "train")
    val = []
    if (root / "val").is_dir():
        val, val_classes = scan_image_folder(root / "val")
        if val_classes != classes:
            raise UserError(f"{root}/train and {root}/val hold different class folders: they must match")
    return train + val, classes, [False] * len(train) + [True] * len(val), root


def csv_images(data_dir: str | Path, labels_csv: str | Path) -> tuple:
    """Samples labelled by a CSV file; rows whose image lies under val/ are the validation split."""
    csv_path = find_labels_csv(labels_csv, data_dir)
    rows = read_csv_rows(csv_path)
    first = image_path(rows[0][1][0])
    root = dataset_root(data_dir, first)
    labelled, bad = [], []
    for line, fields in rows:
        problem = row_problem(fields, root)
        if problem:
            bad.append(f"{csv_path} line {line} ({','.join(fields)!r}): {problem}")
        else:
            labelled.append((image_path(fields[0]), fields[1].strip()))
    if bad:
        more = f" ({len(bad)} bad rows in all)" if len(bad) > 1 else ""
        raise UserError(f"{bad[0]}{more}: fix or remove the row")
    classes = sorted({name for _, name in labelled})
    index = {name: label for label, name in enumerate(classes)}
    samples = [(root / path, index[name]) for path, name in labelled]
    return samples, classes, [PurePosixPath(path).parts[0] == "val" for path, _ in labelled], root


def find_labels_csv(labels_csv: str | Path, data_dir: str | Path) -> Path:
    """The CSV file as given, or, for a relative name not found from here, inside the data folder."""
    path = Path(labels_csv)
    if path.is_file():
        return path
    if not path.is_absolute():
        root = dataset_root(data_dir, path)
        if (root / path).is_file():
            return root / path
    raise UserError(
        f"labels file {labels_csv} not found, neither from the working folder nor in {data_dir}: pass --labels-csv PATH"
    )


def read_csv_rows(csv_path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every row after the header, blank lines skipped."""
    # utf-8-sig: spreadsheet programs start their CSV files with a byte-order mark.
    with open(csv_path, newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        header = next(reader, None)
        if not header or len(header) < 2:
            raise UserError(
                f"labels file {csv_path} needs a header row and two columns, image path then class name: "
                f"its first row is {','.join(header or [])!r}"
            )
        rows = [(reader.line_num, fields) for fields in reader if any(field.strip() for field in fields)]
    if not rows:
        raise UserError(f"labels file {csv_path} has a header row but no rows of labels")
    return rows


def csv_column(data_dir: str | Path, labels_csv: str | Path, column: str) -> dict[str, str]:
    """Each image's value of `column` in the labels CSV (--group-column), by its path as the CSV gives it."""
    csv_path = find_labels_csv(labels_csv, data_dir)
    with open(csv_path, newline="", encoding="utf-8-sig") as file:
        reader = csv.DictReader(file)
        names = [name.strip() for name in reader.fieldnames or []]
        if column not in names:
            raise UserError(f"labels file {csv_path} has no column {column!r} (its columns: {', '.join(names)})")
        reader.fieldnames = names
        return {image_path(row[names[0]]): (row[column] or "").strip() for row in reader if row[names[0]]}


def image_path(field: str) -> str:
    return field.strip().replace("\\", "/")


def row_problem(fields: list[str], root: Path) -> str | None:
    if len(fields) < 2 or not fields[1].strip():
        return "no label in the second column"
    path = image_path(fields[0])
    if not path:
        return "no image path in the first column"
    if not (root / path).is_file():
        return f"image {root / path} not found (paths are relative to {root})"
    return None


def held_out(samples: list[Sample], classes: list[str], fraction: float, seed: int) -> Splits:
    train_indices, val_indices = split_by_label([label for _, label in samples], fraction, seed)
    log.info("no val/ split: %d of %d images held out (--val-fraction %g)", len(val_indices), len(samples), fraction)
    if not val_indices:
        raise UserError(
            f"no validation images to hold out: {len(samples)} images in {len(classes)} classes, and a class needs "
            "two images or more for one to be held out; add images, or provide a val/ split"
        )
    return Splits([samples[i] for i in train_indices], [samples[i] for i in val_indices], classes)


def load_image(path: Path, size: int, channels: int = 3, mean=MEAN, std=STD) -> np.ndarray:
    """An image as a float32 array of shape (channels, size, size), normalised as (pixel/255 - mean) / std.

    channels 3: RGB (a grey image is repeated); channels 1: grey. A file that cannot be
    read raises UnreadableImage naming it.
    """
    mode = {1: "L", 3: "RGB"}[channels]
    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert(mode).resize((size, size), Image.BILINEAR), dtype=np.float32)
    except Exception as error:  # whatever Pillow raises for a damaged file (OSError, SyntaxError, zlib.error, ...)
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise UnreadableImage(
            f"image {path} cannot be read ({reason}): replace or delete it (or its row of the labels CSV)"
        ) from None
    pixels = pixels.reshape(size, size, channels).transpose(2, 0, 1) / np.float32(255.0)
    shape = (-1, 1, 1)
    return (pixels - np.asarray(mean, np.float32).reshape(shape)) / np.asarray(std, np.float32).reshape(shape)


def synthetic_images(
    count: int, num_classes: int, size: int, seed: int, channels: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Noisy copies of one random pattern per class: learnable, so a smoke run shows progress."""
    rng = np.random.default_rng(seed)
    patterns = rng.standard_normal((num_classes, channels, size, size), dtype=np.float32)
    labels = rng.integers(0, num_classes, count)
    noise = rng.standard_normal((count, channels, size, size), dtype=np.float32)
    return patterns[labels] + 2.0 * noise, labels.astype(np.int64)


def describe(dataset, classes: list[str], image_size: int, channels: int):
    """Attach to a dataset what a checkpoint records about its images (see data.py's docstring): its
    `description`, and each entry as an attribute of its own; return it."""
    dataset.description = {
        "classes": list(classes), "image_size": image_size, "channels": channels, "mean": MEAN, "std": STD,
    }  # fmt: skip
    for name, value in dataset.description.items():
        setattr(dataset, name, value)
    return dataset


def option(args, name: str, default):
    """A flag of run.py, or its default when args come from elsewhere (a notebook, a script) without it."""
    value = getattr(args, name, None)
    return default if value is None else value


class Arrays:
    """A dataset of arrays held in memory, the n-th sample the n-th row of each (synthetic images and labels)."""

    def __init__(self, *arrays: np.ndarray):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: int) -> tuple:
        return tuple(array[index] for array in self.arrays)


class ImageFiles:
    """Images read by `read` from their paths, without labels: predict.py's, decoded in the loader's workers."""

    def __init__(self, paths: list[Path], read):
        self.paths, self.read = paths, read

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.read(self.paths[index])


def images_to_predict(source: Path) -> tuple[Path, list[str]]:
    """predict.py's images: the one image `source`, or every image under the folder `source` (an archive is
    extracted by predict.py); their folder, and their paths relative to it, sorted as strings."""
    if source.is_file() and source.suffix.lower() in IMAGE_EXTENSIONS:
        return source.parent, [source.name]
    return source, predict_images(source)


def predict_images(source: Path) -> list[str]:
    """Every image under the folder `source`, as paths relative to it, sorted as strings (the data.py of versions
    before 1.3.2 calls it for predict.py's images)."""
    if not source.is_dir():
        raise UserError(f"--input {source} is not an image, a folder of images or an archive: pass one of those")
    names = sorted(path.relative_to(source).as_posix() for path in find_images(source))
    if not names:
        kinds = ", ".join(sorted(IMAGE_EXTENSIONS))  # (in one order: each process says the same line, said once)
        raise UserError(f"no images found under {source}: --input needs image files ({kinds})")
    return names


def reader(description: dict, image_size: int, channels: int):
    """load_image() as training read the images (a checkpoint's `description`; its defaults where it says
    nothing): a partial, not a lambda, as loader workers that are spawned get it pickled."""
    return functools.partial(
        load_image, size=description.get("image_size") or image_size, channels=description.get("channels") or channels,
        mean=description.get("mean") or MEAN, std=description.get("std") or STD,
    )  # fmt: skip
