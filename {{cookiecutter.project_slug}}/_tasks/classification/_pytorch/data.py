"""Datasets. Extension point: replace build_datasets() to train on your own data, build_predict_set() to
predict on new inputs.

build_datasets(args) returns (train_set, val_set, num_classes); each set is a
map-style dataset of (image tensor, class index) pairs. Sampling, sharding
across ranks and batching are done for you in loaders.build_loaders().

Each set also says how its images were made, for checkpoints and predict.py, in
its `description` (images.describe() sets it, and each entry as an attribute):
`classes` (class names, in label order), `image_size`, `channels`, `mean` and
`std` (images are (pixel/255 - mean) / std). Set them on your own sets too.
"""

import functools
from pathlib import Path

import torch
from torch.utils.data import Dataset, TensorDataset

from .errors import UserError
from .images import (
    IMAGE_EXTENSIONS,
    MEAN,
    STD,
    VAL_FRACTION,
    describe,
    find_images,
    image_splits,
    load_image,
    option,
    synthetic_images,
)

IMAGE_SIZE = 16  # the default side images are resized to (--image-size): the sample digits are 8x8
CHANNELS = 3  # the default --channels
PREDICT_SAMPLE = "val"  # what of the sample data (under --data-dir) the notebook lets predict.py predict
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN, SYNTHETIC_VAL = 2048, 512


class ImageDataset(Dataset):
    """Image files with their class indices, read with Pillow when asked for."""

    def __init__(self, samples: list[tuple[Path, int]], classes: list[str], image_size: int, channels: int):
        self.samples = samples
        describe(self, classes, image_size, channels)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return torch.from_numpy(load_image(path, self.image_size, self.channels, self.mean, self.std)), label


def build_datasets(args) -> tuple[Dataset, Dataset, int]:
    size, channels = option(args, "image_size", IMAGE_SIZE), option(args, "channels", CHANNELS)
    if args.synthetic:
        count = SYNTHETIC_TRAIN + SYNTHETIC_VAL
        images, labels = synthetic_images(count, SYNTHETIC_CLASSES, size, args.seed, channels)
        images, labels = torch.from_numpy(images), torch.from_numpy(labels)
        classes = [str(label) for label in range(SYNTHETIC_CLASSES)]
        train = TensorDataset(images[:SYNTHETIC_TRAIN], labels[:SYNTHETIC_TRAIN])
        val = TensorDataset(images[SYNTHETIC_TRAIN:], labels[SYNTHETIC_TRAIN:])
        return describe(train, classes, size, channels), describe(val, classes, size, channels), SYNTHETIC_CLASSES
    # train/<class>/ and val/<class>/ folders, or a labels CSV; without val, a held-out part of train.
    splits = image_splits(
        args.data_dir, option(args, "labels_csv", None), option(args, "val_fraction", VAL_FRACTION), args.seed
    )
    train = ImageDataset(splits.train, splits.classes, size, channels)
    val = ImageDataset(splits.val, splits.classes, size, channels)
    return train, val, len(splits.classes)


class ImageFiles(Dataset):
    """Images read by `read` from their paths, without labels: predict.py's, decoded in the loader's workers."""

    def __init__(self, paths: list[Path], read):
        self.paths, self.read = paths, read

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        return self.read(self.paths[index])


def build_predict_set(source: Path, description: dict) -> tuple[Dataset, list[str]]:
    """predict.py's inputs: every image under the folder `source` (an archive is extracted by predict.py), read
    as training read its images (the checkpoint's `description`), and their names: paths relative to `source`,
    sorted as strings (the CSV's order)."""
    if not source.is_dir():
        raise UserError(
            f"--input {source} is not a folder or an archive: pass a folder of images or an archive of them"
        )
    names = sorted(path.relative_to(source).as_posix() for path in find_images(source))
    if not names:
        raise UserError(f"no images found under {source}: --input needs image files ({', '.join(IMAGE_EXTENSIONS)})")
    # A partial, not a lambda: loader workers that are spawned get it pickled.
    read = functools.partial(
        load_image, size=description.get("image_size") or IMAGE_SIZE, channels=description.get("channels") or CHANNELS,
        mean=description.get("mean") or MEAN, std=description.get("std") or STD,
    )  # fmt: skip
    return ImageFiles([source / name for name in names], read), names
