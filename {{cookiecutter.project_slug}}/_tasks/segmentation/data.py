"""Datasets. Extension point: replace build_datasets() to train on your own data, build_predict_set() to
predict on new inputs.

build_datasets(args) returns (train_set, val_set, num_classes); each set is a map-style dataset (any
object with __len__ and __getitem__; the framework's own Dataset classes too) of (image [channels, S, S]
float32, mask [S, S] int64) pairs of arrays, S = --image-size, that the loader makes tensors. Sampling,
sharding across ranks and batching are done for you in loaders.build_loaders().

The data folder (--data-dir) holds images/ and masks/: for images/a/b.jpg the mask is
masks/a/b.png, a PNG whose pixels are class indices (0 = background; IGNORE_INDEX, 255, marks pixels
that no class is learned from, such as VOC's object borders). val/images/ and
val/masks/ are the validation split; without them --val-fraction of the images are held
out. Images are resized bilinearly, masks by nearest neighbour (an index is never blended).

The training set's `description` says how images were read (`image_size`, `channels`, `mean`,
`std`: images are (pixel/255 - mean) / std) and names the classes: checkpoints keep it for predict.py.
"""

import logging
from pathlib import Path

import numpy as np
from PIL import Image

from .archive import dataset_root
from .batches import Labeled, split_by_label
from .errors import UserError
from .images import (
    IMAGE_EXTENSIONS,
    MEAN,
    STD,
    VAL_FRACTION,
    Arrays,
    ImageFiles,
    UnreadableImage,
    find_images,
    images_to_predict,
    load_image,
    option,
    reader,
)

log = logging.getLogger(__name__)

# run.py's options that this file reads, beside run.py's own: plain values (README: "Your own options").
OPTIONS = {
    "--val-fraction": {
        "type": "fraction",
        "default": 0.1,
        "help": "without val/images/ and val/masks/: the part of the images held out for validation, the same "
        "on every rank and run for a given --seed",
    },
    "--image-size": {
        "type": "positive_int",
        "metavar": "N",
        "help": "side in pixels images and masks are resized to (default: IMAGE_SIZE in data.py, 32 for the sample)",
    },
    "--channels": {"type": "int", "choices": [1, 3], "help": "1: grey, 3: RGB (default: CHANNELS in data.py, 3)"},
    "--num-classes": {
        "type": "positive_int",
        "metavar": "N",
        "help": "the number of classes (default: the largest index in the training masks, plus one)",
    },
}
# predict.py's options that task.py's write_predictions() reads.
PREDICT_OPTIONS = {
    "--sample-submission": {
        "type": "file",
        "metavar": "FILE",
        "help": "a competition's sample CSV (an image's ID, a class, a mask): its header and its row order are "
        "followed, each row matched by image (its path, file name, or file name without the extension) and class; "
        "the third column gets the mask, run-length encoded",
    },
    "--rle-order": {
        "choices": ["column", "row"],
        "help": "a CSV's run-length encoding numbers pixels column: top to bottom, then left to right (the usual "
        "competition order; the default); row: left to right, then top to bottom",
    },
}

IMAGE_SIZE = 32  # the default side images and masks are resized to (--image-size): the sample's own
CHANNELS = 3  # the default --channels
PREDICT_SAMPLE = "val/images"  # what of the sample data (under --data-dir) the notebook lets predict.py predict
MAX_CLASSES = 256  # predicted masks are 8-bit PNGs
# A mask value left out of the loss and the metrics (task.py), not a class; None: every value is a class.
IGNORE_INDEX = 255
# Modes whose pixels are class indices: grey, palette (a palette PNG's pixels are its indices), 1-bit, integer.
MASK_MODES = ("L", "P", "1", "I", "I;16")
SYNTHETIC_CLASSES = 3  # background, dim squares, bright squares
SYNTHETIC_TRAIN, SYNTHETIC_VAL = 1024, 256

Pair = tuple[Path, Path]  # (image, its mask)


class SegmentationDataset:
    """Image files and their masks, read with Pillow when asked for."""

    def __init__(self, pairs: list[Pair], image_size: int, channels: int):
        self.pairs, self.image_size, self.channels = pairs, image_size, channels

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        image, mask = self.pairs[index]
        pixels = load_image(image, self.image_size, self.channels, MEAN, STD)
        return pixels, resize_nearest(read_mask(mask), self.image_size)


def build_datasets(args) -> tuple[SegmentationDataset | Arrays, SegmentationDataset | Arrays, int]:
    size, channels = option(args, "image_size", IMAGE_SIZE), option(args, "channels", CHANNELS)
    if args.synthetic:
        images, masks = synthetic_masks(SYNTHETIC_TRAIN + SYNTHETIC_VAL, size, args.seed, channels)
        train = Arrays(images[:SYNTHETIC_TRAIN], masks[:SYNTHETIC_TRAIN])
        val = Arrays(images[SYNTHETIC_TRAIN:], masks[SYNTHETIC_TRAIN:])
        return describe(train, SYNTHETIC_CLASSES, size, channels), val, SYNTHETIC_CLASSES
    train_pairs, val_pairs = mask_splits(args.data_dir, option(args, "val_fraction", VAL_FRACTION), args.seed)
    num_classes = count_classes(train_pairs, val_pairs, option(args, "num_classes", None))
    train = SegmentationDataset(train_pairs, size, channels)
    return describe(train, num_classes, size, channels), SegmentationDataset(val_pairs, size, channels), num_classes


def describe(dataset, num_classes: int, image_size: int, channels: int):
    """What a checkpoint keeps about the images (see the module's docstring), on `dataset`; return it."""
    dataset.description = {
        "classes": [str(index) for index in range(num_classes)],
        "image_size": image_size, "channels": channels, "mean": MEAN, "std": STD,
    }  # fmt: skip
    return dataset


def build_labeled_set(args) -> Labeled:
    """--folds: the images of images/ and val/images/ together, with their masks; each image's id (its path under
    the data folder) and stratum (the classes its mask holds)."""
    size, channels = option(args, "image_size", IMAGE_SIZE), option(args, "channels", CHANNELS)
    if args.synthetic:
        images, masks = synthetic_masks(SYNTHETIC_TRAIN + SYNTHETIC_VAL, size, args.seed, channels)
        dataset = describe(Arrays(images, masks), SYNTHETIC_CLASSES, size, channels)
        strata, ids = [str(np.unique(mask).tolist()) for mask in masks], [f"synthetic:{n}" for n in range(len(masks))]
        return Labeled(dataset, SYNTHETIC_CLASSES, ids, strata, keys=[(name, (size, size)) for name in ids])
    root = mask_root(args.data_dir)
    pairs = find_pairs(root / "images", root / "masks")
    if (root / "val" / "images").is_dir():
        pairs += find_pairs(root / "val" / "images", root / "val" / "masks")
    num_classes = count_classes(pairs, [], option(args, "num_classes", None))
    dataset = describe(SegmentationDataset(pairs, size, channels), num_classes, size, channels)
    ids = [image.relative_to(root).as_posix() for image, _ in pairs]
    strata = [str(np.unique(read_mask(mask)).tolist()) for _, mask in pairs]
    keys = [(name, image_size(image)) for name, (image, _) in zip(ids, pairs, strict=True)]  # predictions' own size
    return Labeled(dataset, num_classes, ids, strata, keys=keys)


def mask_root(data_dir: str | Path) -> Path:
    root = dataset_root(data_dir, "images")
    if not (root / "images").is_dir():
        raise UserError(
            f"data folder {root / 'images'} not found: --data-dir needs images/ and masks/ inside (and val/images/, "
            "val/masks/ for validation), or one folder holding them"
        )
    return root


def mask_splits(data_dir: str | Path, val_fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """The (image, mask) pairs for training and for validation: val/ if there is one, else a held-out part."""
    root = mask_root(data_dir)
    train = find_pairs(root / "images", root / "masks")
    if (root / "val" / "images").is_dir():
        return train, find_pairs(root / "val" / "images", root / "val" / "masks")
    kept, held = split_by_label([0] * len(train), val_fraction, seed)  # the same images on every rank, every run
    if not held:
        raise UserError(f"no validation images to hold out from {len(train)} in {root / 'images'}: add val/images/")
    log.info("no val/ split: %d of %d images held out (--val-fraction %g)", len(held), len(train), val_fraction)
    return [train[i] for i in kept], [train[i] for i in held]


def find_pairs(images_dir: Path, masks_dir: Path) -> list[Pair]:
    """Every image under `images_dir` with its mask: the same relative path under `masks_dir`, suffix .png."""
    if not masks_dir.is_dir():
        raise UserError(f"masks folder {masks_dir} not found: each image of {images_dir} needs a mask there")
    images = by_stem(find_images(images_dir), images_dir)
    masks = by_stem([path for path in find_images(masks_dir) if path.suffix.lower() == ".png"], masks_dir)
    if not images:
        raise UserError(f"no images found in {images_dir} ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    for stem, mask in masks.items():
        if stem not in images:
            raise UserError(f"mask {mask} has no image: expected {images_dir / stem}.<png, jpg, ...>")
    for stem, image in images.items():
        if stem not in masks:
            raise UserError(f"image {image} has no mask: expected {masks_dir / stem}.png")
    return [(images[stem], masks[stem]) for stem in sorted(images)]


def by_stem(paths: list[Path], root: Path, clash: str = "which one goes with the mask is unclear") -> dict[str, Path]:
    """Files by their path relative to `root` without the suffix ("a/b"): the name an image and its mask share."""
    found: dict[str, Path] = {}
    for path in paths:
        stem = path.relative_to(root).with_suffix("").as_posix()
        if stem in found:
            raise UserError(f"{found[stem]} and {path} differ only in their suffix: {clash}; rename one")
        found[stem] = path
    return found


def count_classes(train: list[Pair], val: list[Pair], asked: int | None) -> int:
    """--num-classes, or the largest index in the training masks plus one (IGNORE_INDEX is none); every mask read
    once, checked."""
    largest, ignores = {}, False
    for image, mask in [*train, *val]:
        indices = checked_mask(image, mask)
        classes = indices if IGNORE_INDEX is None else indices[indices != IGNORE_INDEX]
        largest[mask] = int(classes.max(initial=0))
        ignores = ignores or classes.size < indices.size
    num_classes = asked or max(largest[mask] for _, mask in train) + 1
    if ignores and not any(largest.values()):  # (nothing but the background and ignored pixels)
        raise UserError(
            f"the masks hold 0 and {IGNORE_INDEX} only, and {IGNORE_INDEX} marks pixels left out (IGNORE_INDEX in "
            f"data.py): binary masks saved as 0 and 255? Save them as 0 and 1, or set IGNORE_INDEX = None"
        )
    most = MAX_CLASSES if IGNORE_INDEX is None else min(MAX_CLASSES, IGNORE_INDEX)  # (each class below IGNORE_INDEX)
    if num_classes > most:
        raise UserError(
            f"{num_classes} classes: masks are 8-bit and IGNORE_INDEX in data.py is {IGNORE_INDEX}: at most "
            f"{most} classes"
        )
    for _, mask in [*train, *val]:
        if largest[mask] >= num_classes:
            raise UserError(
                f"mask {mask} holds class index {largest[mask]}, but there are {num_classes} classes "
                f"({'--num-classes' if asked else 'the largest index in the training masks plus one'}): "
                f"fix the mask, or pass {'a larger ' if asked else ''}--num-classes"
            )
    return num_classes


def checked_mask(image: Path, mask: Path) -> np.ndarray:
    """The mask's class indices, which must be as large as its image."""
    indices = read_mask(mask)
    width, height = image_size(image)
    if indices.shape != (height, width):
        raise UserError(
            f"mask {mask} is {indices.shape[1]}x{indices.shape[0]} pixels, its image {image} {width}x{height}: "
            "a mask must be as large as its image"
        )
    return indices


def read_mask(path: Path) -> np.ndarray:
    """A mask's class indices as an int64 array (height, width), as stored: never converted or interpolated."""
    try:
        with Image.open(path) as image:
            mode = image.mode
            indices = np.asarray(image, dtype=np.int64) if mode in MASK_MODES else None
    except Exception as error:  # whatever Pillow raises for a damaged file
        raise UnreadableImage(f"mask {path} cannot be read ({type(error).__name__}): replace or delete it") from None
    if indices is None:
        raise UserError(
            f"mask {path} is a {mode} image: a mask holds one class index per pixel (a grey 'L' or palette 'P' PNG)"
        )
    return indices


def resize_nearest(indices: np.ndarray, size: int) -> np.ndarray:
    """`indices` resized to size x size, each pixel the index nearest its centre."""
    height, width = indices.shape
    rows = ((np.arange(size) + 0.5) * height / size).astype(np.int64)
    columns = ((np.arange(size) + 0.5) * width / size).astype(np.int64)
    return np.ascontiguousarray(indices[rows][:, columns])


def synthetic_masks(count: int, size: int, seed: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy images of one to three squares anywhere, dim (class 1) or bright (class 2), and their masks."""
    rng = np.random.default_rng(seed)
    pixels = rng.normal(0.0, 0.05, (count, size, size))
    masks = np.zeros((count, size, size), dtype=np.int64)
    for index in range(count):
        for _ in range(rng.integers(1, 4)):
            side = int(rng.integers(max(1, size // 8), max(2, size // 3) + 1))
            top, left = rng.integers(0, size - side + 1, 2)
            label = int(rng.integers(1, SYNTHETIC_CLASSES))
            pixels[index, top : top + side, left : left + side] += label / (SYNTHETIC_CLASSES - 1)
            masks[index, top : top + side, left : left + side] = label
    images = ((np.clip(pixels, 0.0, 1.0) - MEAN) / STD).astype(np.float32)
    return np.repeat(images[:, None], channels, axis=1), masks


def build_predict_set(source: Path, description: dict) -> tuple[ImageFiles, list[tuple[str, tuple[int, int]]]]:
    """predict.py's inputs: every image under the folder `source` (an archive is extracted by predict.py), or the
    image `source`, read as training read its images (the checkpoint's `description`), and their keys: (path
    relative to the folder, (width, height) of the image as it is), sorted by path: each predicted mask goes back
    to that size."""
    if (source / "masks").is_dir():  # its masks would be read as images and given masks of their own
        raise UserError(
            f"--input {source} holds masks/ beside its images, as training data does: "
            f"pass the images alone (--input {source / 'images'})"
        )
    folder, names = images_to_predict(source)
    by_stem([folder / name for name in names], folder, "both would be predicted into the same mask file")
    images = ImageFiles([folder / name for name in names], reader(description, IMAGE_SIZE, CHANNELS))
    return images, [(name, image_size(folder / name)) for name in names]


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) of an image, from its header."""
    try:
        with Image.open(path) as image:
            return image.size
    except Exception as error:  # whatever Pillow raises for a damaged file
        raise UnreadableImage(f"image {path} cannot be read ({type(error).__name__}): replace or delete it") from None
