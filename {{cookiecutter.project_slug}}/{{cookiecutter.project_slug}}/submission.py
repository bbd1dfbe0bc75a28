"""predict.py's input and output: the images of a folder or an archive, and the CSV file a competition takes."""

import csv
import functools
import hashlib
import os
import tempfile
from pathlib import Path, PurePosixPath

from . import archive, data, images
from .errors import UserError

HEADER = ["image", "label"]
PROBABILITY = "probability"


def input_folder(path: str, max_gb: float, local_rank: int) -> tuple[Path, Path | None]:
    """The folder whose images to predict (a lone top folder unwrapped), and the temporary folder an archive
    was extracted into (None for a folder). The processes of a machine share one extraction."""
    source = Path(path)
    if source.is_dir():
        return archive.dataset_root(source), None
    if not source.is_file():
        raise UserError(f"--input {source} not found: pass a folder of images or an archive of them")
    key = hashlib.sha1(f"{source.resolve()} {archive.archive_identity(source)}".encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"predict-{key}"
    archive.ensure_extracted(
        source, target, max_bytes=max_gb * 1e9, show_progress=archive.show_progress_here(local_rank)
    )
    return archive.dataset_root(target), target


def image_names(root: Path) -> list[str]:
    """Every image under root as its path relative to root, sorted as strings (the CSV's order)."""
    names = sorted(path.relative_to(root).as_posix() for path in images.find_images(root))
    if not names:
        raise UserError(
            f"no images found under {root}: --input needs image files ({', '.join(images.IMAGE_EXTENSIONS)})"
        )
    return names


def image_reader(description: dict):
    """load_image() as training read its images: the checkpoint's size, channels and normalisation.
    (A partial, not a lambda: loader workers that are spawned get it pickled.)"""
    size = description.get("image_size") or data.IMAGE_SIZE
    channels = description.get("channels") or data.CHANNELS
    mean, std = description.get("mean") or images.MEAN, description.get("std") or images.STD
    return functools.partial(images.load_image, size=size, channels=channels, mean=mean, std=std)


def my_batches(count: int, batch_size: int, rank: int, world_size: int) -> list[range]:
    """This process's batches: every world_size-th of [0, B), [B, 2B), ... The batches are the same whatever
    the number of processes, so each image's numbers are too."""
    starts = range(rank * batch_size, count, world_size * batch_size)
    return [range(start, min(start + batch_size, count)) for start in starts]


def write(
    output: str, names: list[str], labels: list[str], probabilities: list[float] | None, sample: str | None
) -> None:
    """The CSV, written whole to a temporary name first: `image,label` rows by image, or the sample's form."""
    if sample:
        header, order = sample_form(Path(sample), names)
        rows = [[_id(names[index]), labels[index]] for index in order]
        probabilities = [probabilities[index] for index in order] if probabilities else None
    else:
        header, rows = HEADER, [[name, label] for name, label in zip(names, labels, strict=True)]
    if probabilities:
        header = [*header, PROBABILITY]
        rows = [[*row, f"{probability:.4f}"] for row, probability in zip(rows, probabilities, strict=True)]
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(temporary, path)


def sample_form(sample: Path, names: list[str]) -> tuple[list[str], list[int]]:
    """The sample submission's header (ID column, label column), and for each of its rows the image it names."""
    if not sample.is_file():
        raise UserError(f"--sample-submission {sample} not found")
    with open(sample, newline="", encoding="utf-8-sig") as file:
        table = [row for row in csv.reader(file) if row]
    if not table or len(table[0]) != 2:
        raise UserError(f"--sample-submission {sample}: expected a header of two columns (ID, label), got {table[:1]}")
    by_id: dict[str, int] = {}
    for index, name in enumerate(names):
        other = by_id.setdefault(_id(name), index)
        if other != index:
            raise UserError(
                f"images {names[other]} and {name} have the same ID {_id(name)!r} for --sample-submission: "
                "an ID is an image's file name without its extension"
            )
    ids = [row[0] for row in table[1:]]
    missing = [image_id for image_id in ids if image_id not in by_id]
    if missing:
        raise UserError(
            f"{len(missing)} of the {len(ids)} IDs of {sample} have no image in --input (the first: {missing[0]!r})"
        )
    return table[0], [by_id[image_id] for image_id in ids]


def _id(name: str) -> str:
    return PurePosixPath(name).stem
