"""Datasets. Extension point: replace build_datasets() to train on your own data.

build_datasets(args) returns (train_set, val_set, num_classes); each set is a
map-style paddle.io.Dataset of (image, class index) pairs. Sampling, sharding
across ranks and batching are done for you in loaders.build_loaders().
"""

from pathlib import Path

import numpy as np
import paddle
from paddle.io import Dataset, TensorDataset

from .errors import UserError
from .images import load_image, scan_image_folder, synthetic_images

IMAGE_SIZE = 16
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN, SYNTHETIC_VAL = 2048, 512


class ImageFolder(Dataset):
    """Images in root/<class>/*, read with Pillow when asked for."""

    def __init__(self, root: Path):
        super().__init__()
        self.samples, self.classes = scan_image_folder(root)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        return load_image(path, IMAGE_SIZE), label


def build_datasets(args) -> tuple[Dataset, Dataset, int]:
    if args.synthetic:
        images, labels = synthetic_images(SYNTHETIC_TRAIN + SYNTHETIC_VAL, SYNTHETIC_CLASSES, IMAGE_SIZE, args.seed)
        # On the CPU, as images read from files would be: the loader moves each batch to the device.
        images, labels = paddle.to_tensor(images, place="cpu"), paddle.to_tensor(labels, place="cpu")
        train = TensorDataset([images[:SYNTHETIC_TRAIN], labels[:SYNTHETIC_TRAIN]])
        val = TensorDataset([images[SYNTHETIC_TRAIN:], labels[SYNTHETIC_TRAIN:]])
        return train, val, SYNTHETIC_CLASSES
    root = Path(args.data_dir)
    train, val = ImageFolder(root / "train"), ImageFolder(root / "val")
    if train.classes != val.classes:
        raise UserError(f"{root}/train and {root}/val hold different class folders: they must match")
    return train, val, len(train.classes)
