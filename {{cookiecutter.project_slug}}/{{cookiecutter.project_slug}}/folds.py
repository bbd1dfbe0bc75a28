"""--folds K: the labeled data split into K folds once (DIR/folds.csv), a run per fold in DIR/fold-k/, each finished
fold's out-of-fold predictions (oof.csv) and validation contributions, and the cross-validation score over them all
(cv.py, and the end of --fold all).

Folds are stratified by what data.py's build_labeled_set() gives as each sample's stratum (a class, a bin of the
target, the set of classes in a mask), or grouped (a group never in two folds); fold sizes differ by at most one
sample per stratum. The ids of folds.csv are data.py's: a CSV's id column, else its file and row, an image's path.
"""

import argparse
import csv
import logging
import os
import socket
from pathlib import Path

import numpy as np

from . import distributed, engine, logs, output_folder
from .batches import Labeled
from .errors import UserError
from .seam import Task, padded
from .workspace import fold_dir

log = logging.getLogger(__package__)

FOLDS_CSV, OOF, CONTRIBUTIONS, CV = "folds.csv", "oof.csv", "oof-contributions.npz", "cv.json"


class Part:
    """The samples of `dataset` at `indices`, their ids and their keys for task.write_predictions(): a fold's
    training or validation set."""

    def __init__(self, dataset, indices: list[int], ids: list[str], keys: list):
        self.dataset, self.indices, self.ids, self.keys = dataset, indices, ids, keys

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int):
        return self.dataset[self.indices[index]]

    def __getattr__(self, name: str):  # the dataset's description and collate
        if name == "dataset":  # (not set yet, in a copy being made)
            raise AttributeError(name)
        return getattr(self.dataset, name)


def datasets(task: Task, args: argparse.Namespace, is_main: bool) -> tuple:
    """(train_set, val_set, outputs): data.py's, or with --folds fold args.fold's of build_labeled_set()'s."""
    if args.folds is None:
        return task.datasets(args)
    labeled = task.labeled_set(args)
    return (*split(labeled, args, is_main), labeled.outputs)


def train_each(args: argparse.Namespace, env, task: Task, train_one, extract_dataset) -> None:
    """train_one(args): the one run asked for (--fold k: then the cross-validation score again where every fold is
    finished); or under --fold all train_one(its args) for each fold not finished yet (a finished one is said and
    skipped), then the cross-validation score (rank 0), the job's log in DIR/train.log, each fold's in its own
    folder. extract_dataset(): the data made readable, for a rerun whose folds are all finished (no run reads it)."""
    if args.fold != "all":
        train_one(args)
        if args.folds and len(_finished_folds(args.folds_dir, args.folds)) == args.folds:
            _score(args.folds_dir, env, task, logs.setup_logging(args.folds_dir, env.rank))  # a fold trained again
        return
    log = logs.setup_logging(args.folds_dir, env.rank)
    split_file = Path(args.folds_dir) / FOLDS_CSV
    if split_file.is_file():  # the split asked for, before any fold is said finished
        _check_count(split_file, _fold_count(split_file), args.folds)
    done = _finished_folds(args.folds_dir, args.folds)
    left = [fold for fold in range(args.folds) if fold not in done]
    if not left:  # no fold's run reads the data: the score is of the data's folds still
        extract_dataset()  # (on every rank whatever it sees of folds.csv, as `left` is rank 0's: it ends in a barrier)
        if split_file.is_file():
            read_folds(split_file, unique_ids(task.labeled_set(args)), args.folds)
    for fold in sorted(done):
        log.info("fold %d of %d is finished (%s): skipped (to train it on to a larger --epochs: --fold %d)", fold,
                 args.folds, Path(fold_dir(args.folds_dir, fold), OOF), fold)  # fmt: skip
    for fold in left:
        with engine.names_as_in_a_new_process():
            train_one(argparse.Namespace(**{**vars(args), "fold": fold, "output_dir": fold_dir(args.folds_dir, fold)}))
    if left:
        log = logs.setup_logging(args.folds_dir, env.rank)
    _score(args.folds_dir, env, task, log)


def _score(directory, env, task: Task, log) -> None:
    """The cross-validation's files and line, by rank 0, once every fold is finished."""
    if env.is_main:
        log.info(cross_validate(directory, task))
    distributed.barrier()


def _finished_folds(directory: str | Path, folds: int) -> set[int]:
    """The finished folds as rank 0 sees them: every rank then trains and scores the same folds, whatever a shared
    file system that lags shows the others."""
    return distributed.share_from_main({fold for fold in range(folds) if finished(directory, fold)}, "rank 0's folds")


def finished(directory: str | Path, fold: int) -> bool:
    return (Path(fold_dir(directory, fold)) / CONTRIBUTIONS).is_file() and (
        Path(fold_dir(directory, fold)) / OOF
    ).is_file()


def assign(strata: list, groups: list | None, folds: int, seed: int) -> list[int]:
    """Each sample's fold, deterministic for `seed`. Stratified: each stratum's samples, shuffled, dealt to the folds
    in turn, each stratum starting where the last one stopped (fold sizes differ by at most one per stratum, and
    overall). Grouped: the groups, largest first (ties in a shuffled order), each to the fold with fewest samples."""
    rng = np.random.default_rng(seed)
    fold_of = [0] * len(strata)
    if groups is None:
        by_stratum: dict = {}
        for index, stratum in enumerate(strata):
            by_stratum.setdefault(str(stratum), []).append(index)
        turn = 0
        for stratum in sorted(by_stratum):
            for index in rng.permutation(by_stratum[stratum]):
                fold_of[int(index)], turn = turn % folds, turn + 1
        return fold_of
    by_group: dict = {}
    for index, group in enumerate(groups):
        by_group.setdefault(str(group), []).append(index)
    if len(by_group) < folds:
        raise UserError(f"--folds {folds}: the data has only {len(by_group)} groups: give at most that many folds")
    names = sorted(by_group)
    order = sorted(rng.permutation(len(names)), key=lambda position: -len(by_group[names[position]]))
    sizes = [0] * folds
    for position in order:
        fold = sizes.index(min(sizes))
        for index in by_group[names[position]]:
            fold_of[index] = fold
        sizes[fold] += len(by_group[names[position]])
    return fold_of


def split(labeled: Labeled, args: argparse.Namespace, is_main: bool) -> tuple[Part, Part]:
    """Fold args.fold's training set (the other folds) and validation set (its own), by DIR/folds.csv: written by
    the first run (atomically), read by every later one, which stops in one line where the data has changed."""
    ids = unique_ids(labeled)
    path = Path(args.folds_dir) / FOLDS_CSV
    if path.is_file():
        fold_of = read_folds(path, ids, args.folds)
    else:
        fold_of = assign(labeled.strata, labeled.groups, args.folds, args.seed)
        if is_main:
            write_folds(path, ids, fold_of)
    val = [index for index, fold in enumerate(fold_of) if fold == args.fold]
    train = [index for index, fold in enumerate(fold_of) if fold != args.fold]
    log.info("fold %d of %d: %d samples to train on, %d to validate on (%s)", args.fold, args.folds, len(train),
             len(val), path)  # fmt: skip
    keys = labeled.keys or ids
    if labeled.parts is None:  # one description for every fold (the pooled set's), the fold's samples in view
        sets, positions = (labeled.dataset, labeled.dataset), (train, val)
    else:  # the fold's own sets, described from its training samples alone
        sets, positions = labeled.parts(train, val), (range(len(train)), range(len(val)))
    return tuple(
        Part(data, list(at), [ids[i] for i in part], [keys[i] for i in part])
        for data, at, part in zip(sets, positions, (train, val), strict=True)
    )


def unique_ids(labeled: Labeled) -> list[str]:
    ids = [str(sample_id) for sample_id in labeled.ids]
    if len(set(ids)) != len(ids):
        twice = next(sample_id for sample_id in ids if ids.count(sample_id) > 1)
        raise UserError(f"--folds: data.py's build_labeled_set() gives the id {twice!r} to more than one sample")
    return ids


def write_folds(path: Path, ids: list[str], fold_of: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _own_temporary(path)
    with open(temporary, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(["id", "fold"])
        writer.writerows(zip(ids, fold_of, strict=True))
    os.replace(temporary, path)


def read_folds(path: Path, ids: list[str], folds: int) -> list[int]:
    with open(path, newline="", encoding="utf-8") as file:
        saved = {row["id"]: int(row["fold"]) for row in csv.DictReader(file)}
    if set(saved) != set(ids):
        changed = len(set(saved) ^ set(ids))
        raise UserError(
            f"{path} was written for other data ({changed} ids differ from the data's now): train the changed data "
            "in a new --output-dir, or delete folds.csv and every fold-*/ there to start the folds again"
        )
    _check_count(path, max(saved.values()) + 1, folds)
    return [saved[sample_id] for sample_id in ids]


def _check_count(path: Path, counted: int, folds: int) -> None:
    if counted != folds:
        raise UserError(
            f"{path} splits the data into {counted} folds, not --folds {folds}: give --folds {counted}, or train "
            f"{folds} folds in a new --output-dir"
        )


def predict_out_of_fold(
    args, checkpoints, model, val_loader, val_set: Part, env, task: Task, amp_dtype, trained: bool
) -> None:
    """A finished fold (its last epoch, or an early stop): its best checkpoint's out-of-fold predictions and
    validation contributions, through the gathered validation (each sample once, on any number of processes);
    again where this run `trained` a finished fold on (--fold K with a larger --epochs)."""
    if args.folds is None or args.fold in _finished_folds(args.folds_dir, args.folds) and not trained:
        return
    checkpoints.load_best()
    with checkpoints.ema.swapped():  # (--ema: the averaged weights, as validation used them)
        parts = engine.out_of_fold(model, val_loader, env, task, amp_dtype)
    if env.is_main:
        write_out_of_fold(Path(args.output_dir), args.fold, val_set, parts, task, checkpoints.data)


def write_out_of_fold(directory: Path, fold: int, val_set: Part, parts: list, task: Task, description: dict) -> None:
    """Rank 0: the best checkpoint's predictions on its own fold, in the task's prediction form with a last column
    `fold` (oof.csv), and its validation contributions by id (for cv.py). `parts`: every validation batch's
    (number, sums, per-sample values, rows), from every rank."""
    parts = sorted(parts, key=lambda part: part[0])
    sums, per_sample = task.combined([part[:3] for part in parts])
    arrays = {f"sums/{name}": value for name, value in sums.items()}
    arrays |= {f"per_sample/{name}": value for name, value in per_sample.items()}
    temporary = directory / f".{CONTRIBUTIONS}.tmp.npz"
    np.savez(temporary, ids=np.asarray(val_set.ids), **arrays)
    os.replace(temporary, directory / CONTRIBUTIONS)
    rows = [row for part in parts for row in part[3]]
    written = Path(
        task.write_predictions(
            str(directory / f".{OOF}.tmp.csv"), val_set.keys, rows, description, argparse.Namespace()
        )
    )
    with open(written, newline="", encoding="utf-8") as file:
        table = list(csv.reader(file))
    with open(written, "w", newline="", encoding="utf-8") as file:
        csv.writer(file, lineterminator="\n").writerows([[*table[0], "fold"], *([*row, fold] for row in table[1:])])
    os.replace(written, directory / OOF)
    log.info("out-of-fold predictions of fold %d: %s", fold, directory / OOF)


def checkpoints_of(given: list[str], best_in) -> list[Path]:
    """predict.py's --checkpoint as checkpoints: each as given; a top.json's saves (--keep-best); a run's output
    folder, its best (`best_in(folder)`); the folder of a run of --folds, each fold's best in fold order, every
    fold finished (else one line naming the first that is not)."""
    found = []
    for name in given:
        path = Path(name)
        if path.name == output_folder.TOP and path.is_file():
            found += [path.parent / entry["path"] for entry in output_folder.top(path.parent)]
        elif (path / FOLDS_CSV).is_file():
            count = _fold_count(path / FOLDS_CSV)
            unfinished = [fold for fold in range(count) if not finished(path, fold)]
            if unfinished:
                raise UserError(
                    f"fold {unfinished[0]} of {count} in {path} is not finished (no oof.csv): an ensemble of the folds "
                    f"takes each fold's best once its training is over; finish it with --folds {count} --fold "
                    f"{unfinished[0]}, or name the checkpoints to average"
                )
            found += [best_in(Path(fold_dir(path, fold))) for fold in range(count)]
        elif (path / "checkpoints").is_dir():
            found.append(best_in(path))
        else:
            found.append(path)
    return found


def _fold_count(folds_csv: Path) -> int:
    with open(folds_csv, newline="", encoding="utf-8") as file:
        return max(int(row["fold"]) for row in csv.DictReader(file)) + 1


def cross_validate(directory: str | Path, task: Task) -> str:
    """DIR/oof.csv (every fold's rows) and DIR/cv.json: each of the task's metrics over every fold's contributions
    pooled (oof_<name>: as one validation over all the labeled data), each fold's own, their mean and standard
    deviation; returns the cv: line. A fold not finished is one line naming it."""
    directory = Path(directory)
    folds_csv = directory / FOLDS_CSV
    if not folds_csv.is_file():
        raise UserError(f"{folds_csv} not found: give cv.py the --output-dir of a run of --folds K")
    with open(folds_csv, newline="", encoding="utf-8") as file:
        order = {row["id"]: position for position, row in enumerate(csv.DictReader(file))}
        count = max(order.values()) + 1 if order else 0
    folds = _fold_count(folds_csv)
    missing = [fold for fold in range(folds) if not finished(directory, fold)]
    if missing:
        raise UserError(
            f"fold {missing[0]} of {folds} is not finished (no {Path(fold_dir(directory, missing[0]), OOF)}): train it "
            f"with --folds {folds} --fold {missing[0]} (or --fold all)"
        )
    per_fold, sums, per_sample, ids = [], {}, {}, []
    for fold in range(folds):
        saved = np.load(Path(fold_dir(directory, fold)) / CONTRIBUTIONS)
        fold_sums = {key.split("/", 1)[1]: saved[key] for key in saved.files if key.startswith("sums/")}
        fold_values = {key.split("/", 1)[1]: saved[key] for key in saved.files if key.startswith("per_sample/")}
        per_fold.append(task.metrics_of(fold_sums, fold_values, len(saved["ids"])))
        for name, value in fold_sums.items():
            sums[name] = sums[name] + value if name in sums else value
        for name, value in fold_values.items():
            per_sample.setdefault(name, []).append(value)
        ids.extend(saved["ids"].tolist())
    in_id_order = np.argsort([order[sample_id] for sample_id in ids], kind="stable")
    pooled = {name: padded(name, values)[in_id_order] for name, values in per_sample.items()}
    results = {f"oof_{name}": value for name, value in task.metrics_of(sums, pooled, count).items()}
    best = task.best_metric
    values = [metrics[best] for metrics in per_fold]
    mean, std = float(np.mean(values)), float(np.std(values))
    results |= {"folds": folds, f"fold_{best}": values, f"fold_{best}_mean": mean, f"fold_{best}_std": std}
    _write_pooled_rows(directory, folds)
    temporary = _own_temporary(directory / CV)
    temporary.write_text(logs.json_text(results, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, directory / CV)
    oof = results[f"oof_{best}"]
    return f"cv: oof_{best} {oof:.4f}; folds {mean:.4f} +- {std:.4f} ({folds} folds)"


def _write_pooled_rows(directory: Path, folds: int) -> None:
    rows, header = [], None
    for fold in range(folds):
        with open(Path(fold_dir(directory, fold)) / OOF, newline="", encoding="utf-8") as file:
            table = list(csv.reader(file))
        header = header or table[0]
        rows.extend(table[1:])
    temporary = _own_temporary(directory / OOF)
    with open(temporary, "w", newline="", encoding="utf-8") as file:
        csv.writer(file, lineterminator="\n").writerows([header, *rows])
    os.replace(temporary, directory / OOF)


def _own_temporary(path: Path) -> Path:
    """Where this process writes `path` before it replaces it: array tasks whose folds end at once (on machines of a
    shared folder) each write the folds' files; each whole, the last one's stays (they are the same)."""
    return path.with_name(f".{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
