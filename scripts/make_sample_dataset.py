"""Build the sample dataset archive that baked projects train on out of the box.

The UCI 8x8 handwritten digits (1,797 images, CC BY 4.0), as shipped by
scikit-learn, written as grayscale PNGs in the image-folder layout
``train/<class>/*.png`` and ``val/<class>/*.png`` (a stratified 80/20 split),
then zipped. Run it only to rebuild the committed archive:

    python scripts/make_sample_dataset.py
"""

import argparse
import io
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "{{cookiecutter.project_slug}}" / "data" / "digits.zip"
# A fixed timestamp keeps the archive byte-for-byte reproducible.
ZIP_DATE = (2020, 1, 1, 0, 0, 0)


def png_bytes(pixels: np.ndarray) -> bytes:
    # sklearn's digits are 0..16 intensities; stretch them to 8-bit grey.
    image = Image.fromarray((pixels * 255 / 16).round().astype(np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    digits = load_digits()
    indices = np.arange(len(digits.target))
    train_idx, val_idx = train_test_split(indices, test_size=0.2, random_state=0, stratify=digits.target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(args.out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for split, split_idx in (("train", train_idx), ("val", val_idx)):
            for i in sorted(split_idx):
                info = zipfile.ZipInfo(f"{split}/{digits.target[i]}/{i:04d}.png", date_time=ZIP_DATE)
                archive.writestr(info, png_bytes(digits.images[i]), compress_type=zipfile.ZIP_STORED)
    print(f"wrote {args.out} ({len(train_idx)} train, {len(val_idx)} val images)")


if __name__ == "__main__":
    main()
