"""predict.py's input and output: a file, a folder or an archive (extracted), the batches of each process, and the
CSV file a competition takes (in the form of its sample submission; masks run-length encoded)."""

import csv
import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

import numpy as np

from . import archive
from .errors import UserError
from .workspace import ARCHIVE_SUFFIXES

PROBABILITY = "probability"
MASK_HEADER = ["id", "class", "rle"]
# How run-length encoding numbers a mask's pixels: "column" (the usual competition order) top to bottom, then left to
# right; "row" left to right, then top to bottom. By numpy's flattening order.
RLE_ORDERS = {"column": "F", "row": "C"}


def input_path(path: str, max_gb: float, local_rank: int, rank: int) -> tuple[Path, Path | None]:
    """What to predict: a file or folder as given (a folder's lone top folder unwrapped), or the folder an
    archive was extracted into; and that temporary folder (None without an archive). The processes of a
    machine share one extraction, which each one uses until leave_input()."""
    source = Path(path)
    if source.is_dir():
        return archive.dataset_root(source), None
    if not source.is_file():
        where = "" if source.is_absolute() else f" in {Path.cwd()}"  # (predict.sh starts in the project folder)
        raise UserError(f"--input {source} not found{where}: pass the file, folder or archive to predict")
    if not source.name.lower().endswith(ARCHIVE_SUFFIXES):
        return source, None
    key = hashlib.sha1(f"{source.resolve()} {archive.archive_identity(source)}".encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"predict-{key}"
    _users(target).mkdir(exist_ok=True)  # (before extracting: one that fails leaves nothing behind, see leave_input())
    (_users(target) / str(rank)).touch()
    try:
        archive.ensure_extracted(
            source, target, max_bytes=max_gb * 1e9, show_progress=archive.show_progress_here(local_rank)
        )
    except BaseException:
        leave_input(target, rank)
        raise
    return archive.dataset_root(target), target


def leave_input(extracted: Path | None, rank: int) -> None:
    """This process is done with input_path()'s extraction: the last of the machine's processes to leave, whether
    it ended well or not, removes it (one that ended first, on an error, leaves it to the others still reading)."""
    if extracted is None:
        return
    users = _users(extracted)
    (users / str(rank)).unlink(missing_ok=True)
    try:
        others = any(users.iterdir())
    except FileNotFoundError:  # another process, leaving at the same moment, removed it
        return
    if not others:  # (two leaving together may both remove it)
        shutil.rmtree(extracted, ignore_errors=True)
        shutil.rmtree(users, ignore_errors=True)


def _users(extracted: Path) -> Path:
    """The processes using an extraction, a file each: beside it, not in what is predicted."""
    return extracted.with_name(f"{extracted.name}.users")


def check_apart(input: str, output: str | None, read: dict[str, str] | None = None) -> None:
    """predict.py's --output may not replace what it reads: neither the --input file, nor an --input folder or a
    folder in it, nor the folder of an --input image (each mask is written under its image's own name), nor a path
    of `read` (read_besides()'s: a checkpoint, a sample submission)."""
    if output is None:
        return
    source, target = Path(input).resolve(), Path(output).resolve()
    option = next((option for path, option in (read or {}).items() if Path(path).resolve() == target), None)
    if option:
        raise UserError(f"--output {output} is what {option} names: writing there would replace it; name another file")
    if source.is_dir():
        clash = target == source or source in target.parents
    else:
        clash = target == source or (target == source.parent and not source.name.lower().endswith(ARCHIVE_SUFFIXES))
    if clash:
        raise UserError(
            f"--output {output} is where --input {input} is read from: what predict.py writes there would replace "
            "the inputs; name a file or folder outside it"
        )
    refuse_a_folder_in_use(Path(output))


def refuse_a_folder_in_use(output: Path) -> None:
    """An --output folder that is not empty: what predict.py writes would mix with what is there (the masks of an
    earlier prediction, submitted with this one's)."""
    if output.is_dir() and any(output.iterdir()):
        raise UserError(f"--output {output} is a folder that is not empty: name a new file or folder")


def read_besides(args, checkpoints: list[Path]) -> dict[str, str]:
    """What predict.py reads besides --input, by the option that names it: the checkpoints, and each file another
    option names (a task's --sample-submission, ...)."""
    named = {
        value: f"--{name.replace('_', '-')}"
        for name, value in vars(args).items()
        if name not in ("input", "output") and isinstance(value, str) and Path(value).is_file()
    }
    return named | {str(path): "--checkpoint" for path in checkpoints}


def write_csv(
    output: str,
    header: list[str],
    names: list[str],
    labels: list,
    probabilities: list[float] | None = None,
    sample: str | None = None,
    ids: list | None = None,
) -> None:
    """The CSV, written whole to a temporary name first: `header` then a `name,label` row each, or the form of a
    sample submission (`sample`, sample_rows()), whose ID column names each input by its entry of `ids` (default:
    its name; a tuple: any of its IDs, image_ids())."""
    values = [[label] for label in labels]
    if probabilities:
        header = [*header, PROBABILITY]
        values = [[label, f"{probability:.4f}"] for label, probability in zip(labels, probabilities, strict=True)]
    if sample:
        given = [input_id if isinstance(input_id, tuple) else (input_id,) for input_id in ids or names]
        keys = [[(str(one),) for one in dict.fromkeys((name, *more))] for name, more in zip(names, given, strict=True)]
        header, rows = sample_rows(Path(sample), sample_table(Path(sample)), header, keys, values.__getitem__)
    else:
        rows = [[name, *value] for name, value in zip(names, values, strict=True)]
    write_rows(output, header, rows)


def write_mask_files(output: str, names: list[str], mask_of: Callable[[int], np.ndarray]) -> str:
    """Each input's mask as an 8-bit PNG (a class index a pixel) in the new or empty folder `output`, under the
    input's relative path with the suffix .png; the folder."""
    from PIL import Image  # (the image tasks' own need)

    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--output {folder} is a file: name a folder for the masks, or FILE.csv for a CSV")
    refuse_a_folder_in_use(folder)
    for index, name in enumerate(names):
        path = folder / PurePosixPath(name).with_suffix(".png")
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")  # a stopped run leaves no half-written mask
        Image.fromarray(mask_of(index)).save(temporary, format="PNG")
        os.replace(temporary, path)
    return str(folder)


def write_masks(
    output: str,
    names: list[str],
    mask_of: Callable[[int], np.ndarray],
    classes: Sequence[str],
    order: str = "column",
    sample: str | None = None,
    ids: list[tuple[str, ...]] | None = None,
) -> None:
    """Masks as a competition's CSV, written as write_csv() writes: `id,class,rle`, for each input of `names` (its
    mask: `mask_of(index)`, class indices) a row per class present but the background (0), its pixels run-length
    encoded (rle_encode(), in `order`), or one row with an empty class and rle where there is none; or the form of a
    sample submission (`sample`), whose rows name an input (by any of its `ids`) and a class (by its name), or, for
    two classes, a sample of two columns (an image's ID, its mask: one class and the background) the input alone."""
    mask_of = functools.lru_cache(maxsize=1)(mask_of)  # a sample's rows name an image's classes one after another
    if sample:
        table = sample_table(Path(sample))
        by_image = len(table[0]) == 2 and len(classes) == 2
        labels = [1] if by_image else range(len(classes))
        keys = [
            [(one,) if by_image else (one, classes[label]) for one in dict.fromkeys((name, *input_ids))]
            for name, input_ids in zip(names, ids or [()] * len(names), strict=True)
            for label in labels
        ]

        def encoded(index: int) -> list[str]:  # keys' order: each input's labels in turn
            image, label = divmod(index, len(labels))
            return [rle_encode(mask_of(image) == labels[label], order)]

        header = [MASK_HEADER[0], MASK_HEADER[2]] if by_image else MASK_HEADER
        header, rows = sample_rows(Path(sample), table, header, keys, encoded, key_columns=1 if by_image else 2)
    else:
        rows = []
        for index, name in enumerate(names):
            mask = mask_of(index)
            found = [label for label in np.unique(mask).tolist() if label > 0]
            rows += [[name, classes[label], rle_encode(mask == label, order)] for label in found] or [[name, "", ""]]
        header = MASK_HEADER
    write_rows(output, header, rows)


def rle_encode(mask: np.ndarray, order: str = "column") -> str:
    """The pixels set in `mask` as `start length` pairs, pixels numbered from 1 in `order` (RLE_ORDERS)."""
    pixels = np.asarray(mask, dtype=bool).flatten(order=RLE_ORDERS[order])
    # Where a run starts or ends: numbered from 1, the starts and the pixels just after each run, in turn.
    edges = (np.flatnonzero(np.diff(np.concatenate([[False], pixels, [False]]).astype(np.int8))) + 1).tolist()
    return " ".join(f"{start} {end - start}" for start, end in zip(edges[::2], edges[1::2], strict=True))


def image_ids(path: str) -> tuple[str, ...]:
    """The IDs a sample submission may name an image by: its path under the input, its file name, its file name
    without the extension."""
    image = PurePosixPath(path)
    return tuple(dict.fromkeys((path, image.name, image.stem)))


def write_rows(output: str, header: list[str], rows: list[list]) -> None:
    """A CSV file, written whole to a temporary name first: a stopped or failed run leaves none half-written."""
    path = Path(output)
    if path.is_dir():
        raise UserError(f"--output {path} is a folder: name the CSV file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(temporary, path)


def sample_table(sample: Path) -> list[list[str]]:
    """The rows of a sample submission, its header first (empty lines left out)."""
    if not sample.is_file():
        raise UserError(
            f"--sample-submission {sample} {'is a folder: name the CSV file' if sample.is_dir() else 'not found'}"
        )
    with open(sample, newline="", encoding="utf-8-sig") as file:
        table = [row for row in csv.reader(file) if row]
    if not table:
        raise UserError(f"--sample-submission {sample} is empty: it needs a header row and a row per prediction")
    return table


def sample_rows(
    sample: Path,
    table: list[list[str]],
    header: list[str],
    keys: list[list[tuple]],
    values: Callable[[int], list],
    key_columns: int = 1,
) -> tuple[list[str], list[list]]:
    """A sample submission's (`table`'s) form of the predictions: its header and, for each of its rows, its first
    `key_columns` fields (an ID; or an image and a class) with the values of the prediction they name (`keys`: for
    each prediction, the keys that name it; `values(index)`: its columns after `header`'s keys). The sample's
    columns after its keys take those values in the order `header` has them (the label, then a probability, ...);
    columns the sample lacks are added with `header`'s names, and a sample column nothing fills is refused."""
    if len(table[0]) <= key_columns:
        raise UserError(
            f"--sample-submission {sample}: expected a header of {', '.join(header[:key_columns])} and the "
            f"prediction's columns (as {', '.join(header)}), got {', '.join(table[0])}"
        )
    unfilled = table[0][len(header) :]
    if unfilled:
        raise UserError(
            f"--sample-submission {sample} has the columns {', '.join(table[0])}; this prediction writes "
            f"{len(header)} ({', '.join(header)}): nothing fills {', '.join(unfilled)} (predict.py --help lists "
            "the options that add a column)"
        )
    by_key: dict[tuple, int] = {}
    shared: dict[tuple, tuple[int, int]] = {}  # keys that name two predictions: refused where the sample uses one
    for index, names in enumerate(keys):
        for key in names:
            other = by_key.setdefault(key, index)
            if other != index:
                shared.setdefault(key, (other, index))
    wanted = [tuple(row[:key_columns]) for row in table[1:]]
    for key in wanted:
        if key in shared:
            first, second = (keys[index][0][0] for index in shared[key])
            if first == second:  # (a table's rows are named by their IDs: they are told apart by their places)
                first, second = (f"number {index + 1}" for index in shared[key])
            raise UserError(
                f"inputs {first} and {second} have the same ID {' '.join(key)!r} for --sample-submission {sample}"
            )
    missing = [key for key in wanted if key not in by_key]
    if missing:
        first = missing[0]  # an ID; or an image's ID and a class
        shown = ", ".join(f"{name} {part!r}" for name, part in zip(header[: len(first)], first, strict=True))
        shown = repr(first[0]) if len(first) == 1 else shown
        raise UserError(
            f"{len(missing)} of the {len(wanted)} IDs of {sample} have no input in --input (the first: {shown})"
        )
    rows = [[*key, *values(by_key[key])] for key in wanted]
    return [*table[0], *header[len(table[0]) :]], rows
