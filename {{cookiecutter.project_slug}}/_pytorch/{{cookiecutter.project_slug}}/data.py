"""Datasets. Extension point: replace build_datasets() to train on your own data.

build_datasets(args) returns (train_set, val_set, num_classes); each set is a
map-style dataset of (image tensor, class index) pairs. Sampling, sharding
across ranks and batching are done for you in loaders.build_loaders().
"""

from pathlib import Path

import torch
from torch.utils.data import Dataset, TensorDataset

from .errors import UserError
from .images import load_image, scan_image_folder, synthetic_images

IMAGE_SIZE = 16
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN, SYNTHETIC_VAL = 2048, 512


class ImageFolder(Dataset):
    """Images in root/<class>/*, read with Pillow when asked for."""

    def __init__(self, root: Path):
        self.samples, self.classes = scan_image_folder(root)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return torch.from_numpy(load_image(path, IMAGE_SIZE)), label


def build_datasets(args) -> tuple[Dataset, Dataset, int]:
    if args.synthetic:
        images, labels = synthetic_images(SYNTHETIC_TRAIN + SYNTHETIC_VAL, SYNTHETIC_CLASSES, IMAGE_SIZE, args.seed)
        images, labels = torch.from_numpy(images), torch.from_numpy(labels)
        train = TensorDataset(images[:SYNTHETIC_TRAIN], labels[:SYNTHETIC_TRAIN])
        val = TensorDataset(images[SYNTHETIC_TRAIN:], labels[SYNTHETIC_TRAIN:])
        return train, val, SYNTHETIC_CLASSES
    root = Path(args.data_dir)
    train, val = ImageFolder(root / "train"), ImageFolder(root / "val")
    if train.classes != val.classes:
        raise UserError(f"{root}/train and {root}/val hold different class folders: they must match")
    return train, val, len(train.classes)
