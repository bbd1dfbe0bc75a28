"""Framework-free image reading: folders of class sub-folders, and synthetic images.

Pillow + numpy only, so it works wherever the framework does (no torchvision).
"""

from pathlib import Path

import numpy as np
from PIL import Image

from .errors import UserError

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def scan_image_folder(root: str | Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """List (path, class index) for every image under root/<class>/, classes sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"data folder {root} not found: pass --data-dir with train/<class>/ and val/<class>/ inside")
    classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    samples = [
        (path, label)
        for label, name in enumerate(classes)
        for path in sorted((root / name).rglob("*"))
        if path.suffix.lower() in IMAGE_EXTENSIONS
    ]
    if not samples:
        raise UserError(f"no images found in {root}: expected {root}/<class>/<image>.png")
    return samples, classes


def load_image(path: Path, size: int) -> np.ndarray:
    """An RGB image as a float32 array of shape (3, size, size), scaled to [-1, 1]."""
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB").resize((size, size), Image.BILINEAR), dtype=np.float32)
    return (pixels.transpose(2, 0, 1) / 127.5) - 1.0


def synthetic_images(count: int, num_classes: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy copies of one random pattern per class: learnable, so a smoke run shows progress."""
    rng = np.random.default_rng(seed)
    patterns = rng.standard_normal((num_classes, 3, size, size), dtype=np.float32)
    labels = rng.integers(0, num_classes, count)
    noise = rng.standard_normal((count, 3, size, size), dtype=np.float32)
    return patterns[labels] + 2.0 * noise, labels.astype(np.int64)
