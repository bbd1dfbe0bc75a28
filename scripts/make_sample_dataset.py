"""Build the sample dataset archives that baked projects train on out of the box.

One small, real, offline sample per task, written as a byte-reproducible zip
(fixed timestamps, sorted entries, fixed seeds; files at the archive root),
under ``{{cookiecutter.project_slug}}/``:

classification (default) -> ``_tasks/classification/data/digits.zip``
    The UCI 8x8 handwritten digits (1,797 images, CC BY 4.0), as shipped by
    scikit-learn, written as grayscale PNGs in the image-folder layout
    ``train/<class>/NNNN.png`` and ``val/<class>/NNNN.png`` (a stratified
    80/20 split, random_state=0; NNNN is the image's index in the dataset).

regression -> ``_tasks/regression/data/diabetes.zip``
    The diabetes table of Efron, Hastie, Johnstone and Tibshirani (2004), as
    shipped by scikit-learn (BSD-3-Clause), unscaled: 442 patients, ten
    baseline variables and a disease-progression target. ``train.csv`` and
    ``val.csv`` (an 80/20 split, random_state=0) with the header
    ``id,age,sex,bmi,bp,s1,s2,s3,s4,s5,s6,target``; ``id`` is the row's index.

text -> ``_tasks/text/data/docstrings.zip``
    Text classification over the Python standard library's own docstrings
    (PSF License): the first paragraph (at most ~300 characters) of the
    docstrings of public functions, classes and methods of four module
    families -- files, numbers, text, network -- labelled with the family.
    Whitespace collapsed, texts under 20 characters dropped, duplicates
    dropped (a text found in two families is dropped altogether), at most
    ``TEXT_CAP`` texts per family, shuffled (seed 0) and split 80/20 per
    family. ``train.csv`` and ``val.csv`` with the header ``id,text,label``.
    Needs only the standard library, but the docstrings are those of the
    running Python, so the archive is reproducible only with the same
    Python version and platform (it was built with CPython 3.11.7 on Linux).

segmentation -> ``_tasks/segmentation/data/digit_masks.zip``
    Derived from the same UCI digits (CC BY 4.0): each 8x8 digit upscaled
    to 16x16 (bilinear), placed at a random position on a 32x32 canvas, plus
    mild Gaussian noise, saved as an 8-bit grey PNG; its mask, a PNG of the
    same name in mode "L", holds a class index per pixel: 0 background,
    1 the stroke of a digit 0-4, 2 the stroke of a digit 5-9 (stroke: the
    upscaled intensity above half its maximum). ``images/NNNN.png`` and
    ``masks/NNNN.png`` for training, ``val/images/NNNN.png`` and
    ``val/masks/NNNN.png`` for validation: the digits' own stratified split.

Run it only to rebuild a committed archive (all tasks but text need numpy,
Pillow and scikit-learn):

    python scripts/make_sample_dataset.py                      # the digits
    python scripts/make_sample_dataset.py --task regression    # or text, segmentation
"""

import argparse
import csv
import importlib
import inspect
import io
import random
import re
import zipfile
from collections import defaultdict
from itertools import dropwhile
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "{{cookiecutter.project_slug}}"
DEFAULT_OUTS = {
    "classification": TEMPLATE / "_tasks" / "classification" / "data" / "digits.zip",
    "regression": TEMPLATE / "_tasks" / "regression" / "data" / "diabetes.zip",
    "text": TEMPLATE / "_tasks" / "text" / "data" / "docstrings.zip",
    "segmentation": TEMPLATE / "_tasks" / "segmentation" / "data" / "digit_masks.zip",
}
# A fixed timestamp keeps the archives byte-for-byte reproducible.
ZIP_DATE = (2020, 1, 1, 0, 0, 0)
SEED = 0


# -- shared helpers -------------------------------------------------------------------------------


def add_file(archive: zipfile.ZipFile, name: str, data: bytes, compress_type: int = zipfile.ZIP_STORED) -> None:
    archive.writestr(zipfile.ZipInfo(name, date_time=ZIP_DATE), data, compress_type=compress_type)


def csv_bytes(header: list, rows: list) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def grey_png(pixels) -> bytes:
    """An 8-bit grey ("L") PNG of a uint8 array."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def digits_split():
    """The UCI digits and their stratified 80/20 split (train and val indices)."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    indices = np.arange(len(digits.target))
    train_idx, val_idx = train_test_split(indices, test_size=0.2, random_state=SEED, stratify=digits.target)
    return digits, train_idx, val_idx


# -- classification: digits.zip -------------------------------------------------------------------


def build_classification(out: Path) -> str:
    import numpy as np

    digits, train_idx, val_idx = digits_split()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for split, split_idx in (("train", train_idx), ("val", val_idx)):
            for i in sorted(split_idx):
                # sklearn's digits are 0..16 intensities; stretch them to 8-bit grey.
                pixels = (digits.images[i] * 255 / 16).round().astype(np.uint8)
                add_file(archive, f"{split}/{digits.target[i]}/{i:04d}.png", grey_png(pixels))
    return f"{len(train_idx)} train, {len(val_idx)} val images"


# -- regression: diabetes.zip ---------------------------------------------------------------------


def compact_number(value: float) -> str:
    """Integers as integers, other values with at most six decimals, shortest form."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(round(value, 6))


def build_regression(out: Path) -> str:
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    diabetes = load_diabetes(scaled=False)
    header = ["id", *diabetes.feature_names, "target"]
    rows = [
        [str(i), *map(compact_number, features), compact_number(target)]
        for i, (features, target) in enumerate(zip(diabetes.data, diabetes.target, strict=True))
    ]
    train_rows, val_rows = train_test_split(rows, test_size=0.2, random_state=SEED)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, split_rows in (("train.csv", train_rows), ("val.csv", val_rows)):
            split_rows = sorted(split_rows, key=lambda row: int(row[0]))
            add_file(archive, name, csv_bytes(header, split_rows), zipfile.ZIP_DEFLATED)
    return f"{len(train_rows)} train, {len(val_rows)} val rows"


# -- text: docstrings.zip -------------------------------------------------------------------------

# Module families with clearly different vocabularies; "str" and "bytes" stand for the built-in types' methods.
TEXT_FAMILIES = {
    "files": "os os.path shutil pathlib glob tempfile filecmp fnmatch stat".split(),
    "numbers": "math cmath statistics decimal fractions random numbers".split(),
    "text": "string re textwrap difflib unicodedata codecs str bytes shlex stringprep locale".split(),
    "network": (
        "socket ssl http.client urllib.request urllib.parse email.message email.utils email.parser email.header"
        " smtplib ftplib"
    ).split(),
}
TEXT_CAP = 270  # texts per family at most
TEXT_MIN_CHARS = 20
TEXT_MAX_CHARS = 300
# The modules that implement a public module's objects, by the top-level name of that module.
TEXT_OWNERS = {"os": {"os", "posix", "nt", "posixpath", "ntpath", "genericpath"}}
BUILTIN_TYPES = {"str": str, "bytes": bytes}


def owner_root(module_name) -> str:
    return (module_name or "").lstrip("_").split(".")[0]


def public_objects(module_name: str):
    """(qualified name, object) for the public functions and classes a module defines, and their methods."""
    if module_name in BUILTIN_TYPES:
        classes, top = [(module_name, BUILTIN_TYPES[module_name])], []
    else:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or dir(module)
        objects = [(name, getattr(module, name, None)) for name in sorted(set(names)) if not name.startswith("_")]
        owners = TEXT_OWNERS.get(owner_root(module_name), {owner_root(module_name)})
        # Objects imported from elsewhere (socket's in ssl, builtins' OSError in os ...) are not this family's.
        objects = [
            (name, obj)
            for name, obj in objects
            if (inspect.isroutine(obj) or inspect.isclass(obj))
            and owner_root(getattr(obj, "__module__", None)) in owners
        ]
        classes = [(name, obj) for name, obj in objects if inspect.isclass(obj)]
        top = [(f"{module_name}.{name}", obj) for name, obj in objects]
    yield from top
    for class_name, cls in classes:
        for name, member in sorted(vars(cls).items()):
            if name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isroutine(member) or isinstance(member, property):
                yield f"{module_name}.{class_name}.{name}", member


def first_paragraph(doc: str, name: str) -> str:
    """A docstring's first paragraph, whitespace collapsed, cut at a word to TEXT_MAX_CHARS; leading
    signature paragraphs (``name(args) -> result``, as C functions have) skipped."""
    paragraphs = [p for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]
    signature = re.compile(rf"\s*(\w+\.)?{re.escape(name)}\s*\(")
    paragraphs = list(dropwhile(signature.match, paragraphs))
    if not paragraphs:
        return ""
    text = " ".join(paragraphs[0].split())
    if len(text) > TEXT_MAX_CHARS:
        text = text[: TEXT_MAX_CHARS + 1].rsplit(" ", 1)[0]
    return text


def docstring_texts() -> dict:
    """{label: sorted distinct texts}, without texts that more than one family has."""
    labels = defaultdict(set)
    for label, modules in TEXT_FAMILIES.items():
        for module_name in modules:
            for qualname, obj in public_objects(module_name):
                doc = getattr(obj, "__doc__", None)
                text = first_paragraph(doc, qualname.rsplit(".", 1)[-1]) if isinstance(doc, str) else ""
                if len(text) >= TEXT_MIN_CHARS:
                    labels[text].add(label)
    texts = defaultdict(list)
    for text, text_labels in labels.items():
        if len(text_labels) == 1:
            texts[text_labels.pop()].append(text)
    return {label: sorted(texts[label]) for label in TEXT_FAMILIES}


def build_text(out: Path) -> str:
    rng = random.Random(SEED)
    samples = []
    for label, texts in docstring_texts().items():
        if len(texts) > TEXT_CAP:
            texts = sorted(rng.sample(texts, TEXT_CAP))
        samples += [(text, label) for text in texts]
    rng.shuffle(samples)
    rows = [(i, text, label) for i, (text, label) in enumerate(samples)]
    # Stratified 80/20: a random fifth of each family goes to val.
    by_label = defaultdict(list)
    for row in rows:
        by_label[row[2]].append(row)
    val_ids = set()
    for label in TEXT_FAMILIES:
        val_ids.update(row[0] for row in rng.sample(by_label[label], round(len(by_label[label]) / 5)))
    train_rows = [row for row in rows if row[0] not in val_ids]
    val_rows = [row for row in rows if row[0] in val_ids]
    header = ["id", "text", "label"]
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        add_file(archive, "train.csv", csv_bytes(header, train_rows), zipfile.ZIP_DEFLATED)
        add_file(archive, "val.csv", csv_bytes(header, val_rows), zipfile.ZIP_DEFLATED)
    counts = ", ".join(f"{label} {len(by_label[label])}" for label in TEXT_FAMILIES)
    braces = sum("{{" in text or "}}" in text for _, text, _ in rows)
    return f"{len(train_rows)} train, {len(val_rows)} val rows ({counts}; {braces} with '{{{{' or '}}}}')"


# -- segmentation: digit_masks.zip ----------------------------------------------------------------

SEG_CANVAS = 32
SEG_DIGIT = 16
SEG_NOISE = 0.03  # standard deviation of the noise, in units of full intensity (about 8 grey levels)
SEG_STROKE = 0.5  # a pixel is stroke where the upscaled digit is above this fraction of its maximum


def upscale(image8x8):
    """An 8x8 digit (0..16) upscaled bilinearly to SEG_DIGIT x SEG_DIGIT, as intensities in 0..1."""
    import numpy as np
    from PIL import Image

    small = Image.fromarray((image8x8 / 16).astype(np.float32), mode="F")
    return np.asarray(small.resize((SEG_DIGIT, SEG_DIGIT), Image.Resampling.BILINEAR), dtype=np.float64)


def digit_and_mask(image8x8, digit: int, offset, noise):
    """A noisy grey image of the digit at offset (row, column) on the canvas, and its class mask."""
    import numpy as np

    digit_image = upscale(image8x8)
    rows, cols = slice(offset[0], offset[0] + SEG_DIGIT), slice(offset[1], offset[1] + SEG_DIGIT)
    canvas = np.zeros((SEG_CANVAS, SEG_CANVAS))
    canvas[rows, cols] = digit_image
    pixels = (np.clip(canvas + noise, 0, 1) * 255).round().astype(np.uint8)
    mask = np.zeros((SEG_CANVAS, SEG_CANVAS), dtype=np.uint8)
    mask[rows, cols][digit_image > SEG_STROKE * digit_image.max()] = 1 if digit < 5 else 2
    return pixels, mask


def build_segmentation(out: Path) -> str:
    import numpy as np

    digits, train_idx, val_idx = digits_split()
    count = len(digits.target)
    rng = np.random.default_rng(SEED)
    offsets = rng.integers(0, SEG_CANVAS - SEG_DIGIT + 1, size=(count, 2))
    noise = rng.normal(0, SEG_NOISE, size=(count, SEG_CANVAS, SEG_CANVAS))
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for prefix, split_idx in (("", train_idx), ("val/", val_idx)):
            for i in sorted(split_idx):
                pixels, mask = digit_and_mask(digits.images[i], int(digits.target[i]), offsets[i], noise[i])
                add_file(archive, f"{prefix}images/{i:04d}.png", grey_png(pixels))
                add_file(archive, f"{prefix}masks/{i:04d}.png", grey_png(mask))
    return f"{len(train_idx)} train, {len(val_idx)} val image/mask pairs"


BUILDERS = {
    "classification": build_classification,
    "regression": build_regression,
    "text": build_text,
    "segmentation": build_segmentation,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task",
        choices=sorted(BUILDERS),
        default="classification",
        help="which sample to build (default: classification, the digits)",
    )
    parser.add_argument("--out", type=Path, default=None, help="archive to write (default: the task's committed one)")
    args = parser.parse_args()

    out = args.out or DEFAULT_OUTS[args.task]
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = BUILDERS[args.task](out)
    print(f"wrote {out} ({summary})")


if __name__ == "__main__":
    main()
