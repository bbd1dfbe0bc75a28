"""predict.py's input and output: a file, a folder or an archive (extracted), the batches of each process, and the
CSV file a competition takes."""

import csv
import hashlib
import os
import tempfile
from pathlib import Path

from . import archive
from .errors import UserError
from .workspace import ARCHIVE_SUFFIXES

PROBABILITY = "probability"


def input_path(path: str, max_gb: float, local_rank: int) -> tuple[Path, Path | None]:
    """What to predict: a file or folder as given (a folder's lone top folder unwrapped), or the folder an
    archive was extracted into; and that temporary folder (None without an archive). The processes of a
    machine share one extraction."""
    source = Path(path)
    if source.is_dir():
        return archive.dataset_root(source), None
    if not source.is_file():
        raise UserError(f"--input {source} not found: pass the file, folder or archive to predict")
    if not source.name.lower().endswith(ARCHIVE_SUFFIXES):
        return source, None
    key = hashlib.sha1(f"{source.resolve()} {archive.archive_identity(source)}".encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"predict-{key}"
    archive.ensure_extracted(
        source, target, max_bytes=max_gb * 1e9, show_progress=archive.show_progress_here(local_rank)
    )
    return archive.dataset_root(target), target


def write_csv(
    output: str,
    header: list[str],
    names: list[str],
    labels: list,
    probabilities: list[float] | None = None,
    sample: str | None = None,
    ids: list[str] | None = None,
) -> None:
    """The CSV, written whole to a temporary name first: `header` then a `name,label` row each, or the form of a
    sample submission (`sample`), whose ID column names each input by its entry of `ids` (default: its name)."""
    if sample:
        ids = [str(input_id) for input_id in ids or names]
        header, order = sample_form(Path(sample), names, ids)
        rows = [[ids[index], labels[index]] for index in order]
        probabilities = [probabilities[index] for index in order] if probabilities else None
    else:
        rows = [[name, label] for name, label in zip(names, labels, strict=True)]
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


def sample_form(sample: Path, names: list[str], ids: list[str]) -> tuple[list[str], list[int]]:
    """The sample submission's header (ID column, label column), and for each of its rows the input it names by
    its ID (`ids`, one per input of `names`)."""
    if not sample.is_file():
        raise UserError(f"--sample-submission {sample} not found")
    with open(sample, newline="", encoding="utf-8-sig") as file:
        table = [row for row in csv.reader(file) if row]
    if not table or len(table[0]) != 2:
        raise UserError(f"--sample-submission {sample}: expected a header of two columns (ID, label), got {table[:1]}")
    by_id: dict[str, int] = {}
    for index, (name, input_id) in enumerate(zip(names, ids, strict=True)):
        other = by_id.setdefault(input_id, index)
        if other != index:
            raise UserError(f"inputs {names[other]} and {name} have the same ID {input_id!r} for --sample-submission")
    wanted = [row[0] for row in table[1:]]
    missing = [input_id for input_id in wanted if input_id not in by_id]
    if missing:
        raise UserError(
            f"{len(missing)} of the {len(wanted)} IDs of {sample} have no input in --input (the first: {missing[0]!r})"
        )
    return table[0], [by_id[input_id] for input_id in wanted]
