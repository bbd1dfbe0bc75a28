"""The table. Extension point: replace build_datasets() to train on your own data, build_predict_set() to
predict on new rows.

--data-dir holds train.csv (and val.csv if you have one; else --val-fraction of the rows is held out).
A header row; every column but `id` (optional; `Id` or `ID` too) and the target (--target, default `target`) is a
numeric feature. Features are standardised with the training rows' mean and standard deviation,
which the sets' `description` keeps for checkpoints and predict.py, with the target's own mean and
standard deviation (build_model() gets them: the model predicts in the target's units).

Each set is a map-style dataset (any object with __len__ and __getitem__; the framework's own Dataset
classes too) of (features, target) pairs: a float32 array of the standardised features and the target in
its own units, which the loader makes tensors. Sampling, sharding across ranks and batching are done for
you in loaders.build_loaders().
"""

import csv
import math
from pathlib import Path

import numpy as np

from . import archive
from .batches import Labeled, quantile_bins
from .errors import UserError

# run.py's options that this file reads, beside run.py's own: plain values (README: "Your own options").
OPTIONS = {
    "--target": {"default": "target", "metavar": "NAME", "help": "the CSV column to learn (default: target)"},
    "--val-fraction": {
        "type": "fraction",
        "default": 0.1,
        "help": "without val.csv: the part of train.csv's rows held out for validation, the same on every rank "
        "and run for a given --seed",
    },
    "--group-column": {
        "metavar": "NAME",
        "help": "with --folds: the CSV column whose equal values form a group (a patient, a site), never split "
        "across folds (not a feature then)",
    },
}
# predict.py's options that task.py's write_predictions() reads.
PREDICT_OPTIONS = {
    "--sample-submission": {
        "type": "file",
        "metavar": "FILE",
        "help": "a competition's sample CSV: its header, its ID column (the input's id) and its row order are "
        "followed; the second column gets the prediction",
    },
}

TRAIN, VAL = "train.csv", "val.csv"
ID = "id"  # an optional column of row names: not a feature; predict.py's output keeps it
PREDICT_SAMPLE = "val.csv"  # what of the sample data (under --data-dir) the notebook lets predict.py predict
SYNTHETIC_FEATURES = 8
SYNTHETIC_TRAIN, SYNTHETIC_VAL = 2048, 512


class Table:
    """Rows of standardised features (float32), each with its target (float32, in the target's units) where there
    are targets (training, validation), alone where there are none (predicting)."""

    def __init__(self, features: np.ndarray, targets: np.ndarray | None = None, description: dict | None = None):
        self.features = np.ascontiguousarray(features, dtype=np.float32)
        self.targets = None if targets is None else np.ascontiguousarray(targets, dtype=np.float32)
        self.description = description

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int):
        if self.targets is None:
            return self.features[index]
        return self.features[index], self.targets[index]


def build_datasets(args) -> tuple[Table, Table, int]:
    """(train_set, val_set, 1): one output, the target."""
    target = args.target
    if args.synthetic:
        names, train, val = synthetic_table(args.seed)
    else:
        root = archive.dataset_root(args.data_dir, TRAIN)
        names, train, val = read_splits(root, target, args.val_fraction, args.seed)
    description = describe(names, target, train)
    return (
        Table(standardised(train[:, :-1], description), train[:, -1], description),
        Table(standardised(val[:, :-1], description), val[:, -1], description),
        1,
    )


def build_labeled_set(args) -> Labeled:
    """--folds: train.csv's rows and val.csv's together, each row's id (the id column, else train.csv:<row>, 1 for
    the first row after the header), stratum (the target's quantile bin) and group (--group-column's value); a
    fold's sets standardised with its own training rows' statistics."""
    if args.synthetic:
        names, train, val = synthetic_table(args.seed)
        table, ids, groups = (
            np.concatenate([train, val]),
            [f"synthetic:{n}" for n in range(len(train) + len(val))],
            None,
        )
    else:
        root = archive.dataset_root(args.data_dir, TRAIN)
        names, table, ids, groups = read_labeled(root, args.target, getattr(args, "group_column", None))

    def parts(train: list[int], val: list[int]) -> tuple[Table, Table]:
        """A fold's sets, standardised with its own training rows' statistics."""
        description = describe(names, args.target, table[train])
        return tuple(
            Table(standardised(table[part, :-1], description), table[part, -1], description) for part in (train, val)
        )

    return Labeled(None, 1, ids, quantile_bins(table[:, -1], args.folds), groups, parts=parts)


def read_labeled(root: Path, target: str, group: str | None) -> tuple[list[str], np.ndarray, list[str], list | None]:
    """The feature names, train.csv's and val.csv's rows (features, then the target), their ids and groups."""
    names, table, ids, groups = None, [], [], []
    for path in (root / TRAIN, root / VAL):
        if not path.is_file():
            continue
        header, rows = read_csv(path)
        if group and group not in header:
            raise UserError(f"{path} has no column {group!r} (its columns: {', '.join(header)}): --group-column NAME")
        names = names or [name for name in header if name not in (ID, target, group)]
        table.append(numbers(path, header, rows, [*names, target]))
        ids += [
            row[header.index(ID)].strip() if ID in header else f"{path.name}:{n}" for n, (_, row) in enumerate(rows, 1)
        ]
        groups += [row[header.index(group)].strip() for _, row in rows] if group else []
    if names is None:
        raise UserError(f"{root / TRAIN} not found: --data-dir needs train.csv (and val.csv if you have one)")
    return names, np.concatenate(table), ids, groups or None


def read_splits(root: Path, target: str, val_fraction: float, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The feature names, and the training and validation rows as float64 arrays: the features in that order,
    then the target. Without val.csv, `val_fraction` of train.csv's rows (the same rows for a `seed`)."""
    path = root / TRAIN
    if not path.is_file():
        raise UserError(
            f"{path} not found: --data-dir needs train.csv (a header row, numeric columns, the target column "
            f"{target!r}), and val.csv if you have one"
        )
    header, rows = read_csv(path)
    if target not in header:
        raise UserError(f"{path} has no column {target!r} (its columns: {', '.join(header)}): pass --target NAME")
    names = [name for name in header if name not in (ID, target)]
    if not names:
        raise UserError(f"{path} has no feature column: every column but {ID!r} and {target!r} is a feature")
    train = numbers(path, header, rows, [*names, target])
    if (root / VAL).is_file():
        return names, train, numbers(root / VAL, *read_csv(root / VAL), [*names, target])
    held = max(1, round(len(train) * val_fraction))
    if held >= len(train):
        raise UserError(f"{path} has {len(train)} rows: too few to hold out --val-fraction {val_fraction} of them")
    order = np.random.default_rng(seed).permutation(len(train))
    return names, train[np.sort(order[held:])], train[np.sort(order[:held])]


def read_csv(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header's column names and each row with its line number (blank lines skipped); one line for a file
    without a header or without rows, a repeated column name, or a row of another length than the header."""
    with open(path, newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        try:
            header = [name.strip() for name in next(reader, [])]
            header = [ID if name.lower() == ID else name for name in header]  # (Id, ID: other spellings of it)
            rows = [(reader.line_num, row) for row in reader if row]
        except (UnicodeDecodeError, csv.Error) as error:
            raise UserError(f"{path} cannot be read as CSV text ({error}): save it as a UTF-8 CSV file") from None
    if not header:
        raise UserError(f"{path} is empty: expected a header row of column names, then one row per sample")
    if not rows:
        raise UserError(f"{path} has a header row but no rows")
    repeated = next((name for name in header if header.count(name) > 1), None)
    if repeated is not None:
        raise UserError(f"{path}: the column {repeated!r} appears more than once in the header")
    for line, row in rows:
        if len(row) != len(header):
            raise UserError(f"{path} line {line}: {len(row)} values, but the header has {len(header)} columns")
    return header, rows


def numbers(path: Path, header: list[str], rows: list[tuple[int, list[str]]], columns: list[str]) -> np.ndarray:
    """The named columns of the rows as float64, one row each; a missing column, or a value that is empty or not
    a finite number: one line naming the file, the line and the column."""
    missing = [name for name in columns if name not in header]
    if missing:
        raise UserError(f"{path} has no column {missing[0]!r}: it needs the columns {', '.join(columns)}")
    positions = [header.index(name) for name in columns]
    values = np.empty((len(rows), len(columns)))
    for index, (line, row) in enumerate(rows):
        for column, (name, position) in enumerate(zip(columns, positions, strict=True)):
            text = row[position].strip()
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if not math.isfinite(number):
                what = f"{text!r} is not a finite number" if text else "the value is empty"
                raise UserError(f"{path} line {line}, column {name!r}: {what} (features and the target are numbers)")
            values[index, column] = number
    return values


def describe(names: list[str], target: str, train: np.ndarray) -> dict:
    """What predicting needs, as plain values (the checkpoint keeps it): the feature columns in order, their
    training mean and standard deviation, the target's name, mean and standard deviation."""
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a constant column stays 0 after centring, not nan
    return {
        "features": names,
        "feature_mean": mean[:-1].tolist(),
        "feature_std": std[:-1].tolist(),
        "num_features": len(names),
        "target": target,
        "target_mean": float(mean[-1]),
        "target_std": float(std[-1]),
    }


def standardised(features: np.ndarray, description: dict) -> np.ndarray:
    return (features - np.array(description["feature_mean"])) / np.array(description["feature_std"])


def synthetic_table(seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A random learnable table, no files read: a linear function of 8 features plus noise, the target far from 1
    (around 100, spread 30), as real targets are."""
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((SYNTHETIC_TRAIN + SYNTHETIC_VAL, SYNTHETIC_FEATURES))
    target = 100 + features @ rng.normal(scale=10, size=SYNTHETIC_FEATURES) + rng.normal(scale=5, size=len(features))
    table = np.column_stack([features, target])
    names = [f"x{number}" for number in range(1, SYNTHETIC_FEATURES + 1)]
    return names, table[:SYNTHETIC_TRAIN], table[SYNTHETIC_TRAIN:]


def build_predict_set(source: Path, description: dict) -> tuple[Table, list[str]]:
    """predict.py's inputs: the rows of the CSV file `source` (or of the one CSV file in the folder `source`, an
    archive extracted), in file order, standardised as training did; and their keys: the `id` column, or the row
    numbers from 0. The file needs the training's feature columns; other columns (the target) are ignored."""
    if "features" not in description:
        raise UserError("the checkpoint does not describe a table (no feature columns): use a checkpoint run.py wrote")
    path = source
    if source.is_dir():
        found = sorted(path for path in source.rglob("*.csv") if not archive.is_junk(path.relative_to(source)))
        if len(found) != 1:
            raise UserError(f"--input {source}: expected one CSV file in it, found {len(found)}; pass the file")
        path = found[0]
    header, rows = read_csv(path)
    features = numbers(path, header, rows, description["features"])
    keys = [row[header.index(ID)].strip() for _, row in rows] if ID in header else [str(n) for n in range(len(rows))]
    return Table(standardised(features, description)), keys
