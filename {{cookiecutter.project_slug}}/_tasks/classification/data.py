"""Datasets. Extension point: replace build_datasets() to train on your own data, build_predict_set() to
predict on new inputs.

build_datasets(args) returns (train_set, val_set, num_classes); each set is a map-style dataset (any
object with __len__ and __getitem__; the framework's own Dataset classes too) of (image, class index)
pairs, an image a float32 array that the loader makes a tensor. Sampling, sharding across ranks and
batching are done for you in loaders.build_loaders().

Each set also says how its images were made, for checkpoints and predict.py, in
its `description` (images.describe() sets it, and each entry as an attribute):
`classes` (class names, in label order), `image_size`, `channels`, `mean` and
`std` (images are (pixel/255 - mean) / std). Set them on your own sets too.
"""

from pathlib import Path

import numpy as np

from .batches import Labeled
from .errors import UserError
from .images import (
    VAL_FRACTION,
    Arrays,
    ImageFiles,
    csv_column,
    describe,
    image_splits,
    images_to_predict,
    labelled_images,
    load_image,
    option,
    reader,
    synthetic_images,
)

# run.py's options that this file reads, beside run.py's own: plain values (README: "Your own options").
OPTIONS = {
    "--labels-csv": {
        "metavar": "FILE",
        "help": "labels from a CSV file with a header row: image path (relative to --data-dir), class name; a "
        "relative FILE not found from here is looked for in --data-dir",
    },
    "--val-fraction": {
        "type": "fraction",
        "default": 0.1,
        "help": "without a validation split (no val/ folder, or no labels-CSV row under val/): the part of each "
        "class held out for validation, the same on every rank and run for a given --seed",
    },
    "--image-size": {
        "type": "positive_int",
        "metavar": "N",
        "help": "side in pixels images are resized to (default: IMAGE_SIZE in data.py, 16 for the sample digits)",
    },
    "--channels": {"type": "int", "choices": [1, 3], "help": "1: grey, 3: RGB (default: CHANNELS in data.py, 3)"},
    "--group-column": {
        "metavar": "NAME",
        "help": "with --folds and --labels-csv: the CSV column whose equal values form a group (a patient, a "
        "camera), never split across folds",
    },
}
# predict.py's options that task.py's write_predictions() reads.
PREDICT_OPTIONS = {
    "--sample-submission": {
        "type": "file",
        "metavar": "FILE",
        "help": "a competition's sample CSV: its header, its ID column (an image's path, file name, or file name "
        "without the extension) and its row order are followed; the second column gets the label, a third the "
        "probability (with --probabilities)",
    },
    "--probabilities": {"action": "store_true", "help": "add a column with the predicted class's probability"},
}

IMAGE_SIZE = 16  # the default side images are resized to (--image-size): the sample digits are 8x8
CHANNELS = 3  # the default --channels
PREDICT_SAMPLE = "val"  # what of the sample data (under --data-dir) the notebook lets predict.py predict
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN, SYNTHETIC_VAL = 2048, 512


class ImageDataset:
    """Image files with their class indices, read with Pillow when asked for."""

    def __init__(self, samples: list[tuple[Path, int]], classes: list[str], image_size: int, channels: int):
        self.samples = samples
        describe(self, classes, image_size, channels)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        return load_image(path, self.image_size, self.channels, self.mean, self.std), label


def build_datasets(args) -> tuple[ImageDataset | Arrays, ImageDataset | Arrays, int]:
    size, channels = option(args, "image_size", IMAGE_SIZE), option(args, "channels", CHANNELS)
    if args.synthetic:
        images, labels = synthetic_images(SYNTHETIC_TRAIN + SYNTHETIC_VAL, SYNTHETIC_CLASSES, size, args.seed, channels)
        classes = [str(label) for label in range(SYNTHETIC_CLASSES)]
        train = Arrays(images[:SYNTHETIC_TRAIN], labels[:SYNTHETIC_TRAIN])
        val = Arrays(images[SYNTHETIC_TRAIN:], labels[SYNTHETIC_TRAIN:])
        return describe(train, classes, size, channels), describe(val, classes, size, channels), SYNTHETIC_CLASSES
    # train/<class>/ and val/<class>/ folders, or a labels CSV; without val, a held-out part of train.
    labels_csv, val_fraction = option(args, "labels_csv", None), option(args, "val_fraction", VAL_FRACTION)
    splits = image_splits(args.data_dir, labels_csv, val_fraction, args.seed)
    train = ImageDataset(splits.train, splits.classes, size, channels)
    val = ImageDataset(splits.val, splits.classes, size, channels)
    return train, val, len(splits.classes)


def build_labeled_set(args) -> Labeled:
    """--folds: every labelled image (train/ and val/ together) as one set, described from all of them; each
    image's id (its path under the data folder), stratum (its class) and group (--group-column's value)."""
    size, channels = option(args, "image_size", IMAGE_SIZE), option(args, "channels", CHANNELS)
    if args.synthetic:
        images, labels = synthetic_images(SYNTHETIC_TRAIN + SYNTHETIC_VAL, SYNTHETIC_CLASSES, size, args.seed, channels)
        classes = [str(label) for label in range(SYNTHETIC_CLASSES)]
        ids = [f"synthetic:{index}" for index in range(len(labels))]
        return Labeled(
            describe(Arrays(images, labels), classes, size, channels), SYNTHETIC_CLASSES, ids, labels.tolist()
        )
    labels_csv, group = option(args, "labels_csv", None), option(args, "group_column", None)
    samples, classes, _, root = labelled_images(args.data_dir, labels_csv)
    ids = [path.relative_to(root).as_posix() for path, _ in samples]
    if group and not labels_csv:
        raise UserError("--group-column reads a column of the labels CSV: pass --labels-csv FILE")
    groups = None
    if group:
        by_image = csv_column(args.data_dir, labels_csv, group)
        groups = [by_image[sample_id] for sample_id in ids]
    dataset = ImageDataset(samples, classes, size, channels)
    return Labeled(dataset, len(classes), ids, [label for _, label in samples], groups)


def build_predict_set(source: Path, description: dict) -> tuple[ImageFiles, list[str]]:
    """predict.py's inputs: every image under the folder `source` (an archive is extracted by predict.py), or the
    image `source`, read as training read its images (the checkpoint's `description`), and their names: paths
    relative to the folder, sorted as strings (the CSV's order)."""
    folder, names = images_to_predict(source)
    return ImageFiles([folder / name for name in names], reader(description, IMAGE_SIZE, CHANNELS)), names
