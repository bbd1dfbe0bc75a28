"""Shared fixtures of the project's tests."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def project_root() -> Path:
    """The baked project's folder, holding run.py and run.sh."""
    return ROOT


def write_image_folder(
    root: Path, classes: list[str], per_class: int, size: int = 8, seed: int = 0, first: int = 0
) -> Path:
    """root/<class>/<class>-<n>.png, n from `first`: small random grey images, `per_class` of each class."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, (size, size), dtype=np.uint8)
            Image.fromarray(pixels, mode="L").save(root / name / f"{name}-{first + index:03d}.png")
    return root
