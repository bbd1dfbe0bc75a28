"""The folders a job uses on each platform: where outputs go (--output-dir, ModelArts's --train_url, the AI Studio
workspace), where a platform's data is (ModelArts's --data_url), and where an archive can be extracted."""

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .errors import PlatformError
from .settings import SAMPLE

# Defaults are anchored to the project folder, so `python /path/to/run.py` works from anywhere.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA_DIR = PROJECT_ROOT / "data" / SAMPLE
SAMPLE_ARCHIVE = PROJECT_ROOT / "data" / f"{SAMPLE}.zip"  # in dataset=zip projects; extracted when first read
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
AISTUDIO_WORKSPACE = Path("/root/paddlejob/workspace")  # PADDLEJOB_WORKSPACE names another (tests)
ARRAY_TASK = "SLURM_ARRAY_TASK_ID"  # sbatch --array: the index of each array task


def aistudio_workspace(env: Mapping[str, str] = os.environ) -> Path | None:
    """The AI Studio script task's workspace, where it exists: only its output/ survives the task."""
    folder = Path(env["PADDLEJOB_WORKSPACE"]) if env.get("PADDLEJOB_WORKSPACE") else AISTUDIO_WORKSPACE
    return folder if folder.is_dir() else None


def output_dir(given: str | None, train_url: str | None, env: Mapping[str, str] = os.environ) -> str:
    """The one decision of where outputs go: --output-dir, else ModelArts's --train_url, else the AI Studio
    workspace's output/, else output/ in the project folder."""
    if given:
        return given
    if train_url:
        return train_url
    workspace = aistudio_workspace(env)
    return str(workspace / "output" if workspace else PROJECT_ROOT / "output")


def place_fold(args, env: Mapping[str, str] = os.environ) -> None:
    """Where a run of --folds K trains: --fold k (or a SLURM array task's index, sbatch --array=0-<K-1>) in
    DIR/fold-k/, its own folder (lock, launcher logs, checkpoints); --fold all (the default) in DIR, fold after
    fold. DIR, the --output-dir given, holds folds.csv, oof.csv and cv.json (args.folds_dir)."""
    args.folds_dir = None
    if args.folds is None:
        if args.fold is not None:
            raise PlatformError("--fold needs --folds K: the number of folds the data is split into")
        return
    fold = args.fold if args.fold is not None else env.get(ARRAY_TASK, "all")
    if fold != "all" and not (fold.isdigit() and int(fold) < args.folds):
        raise PlatformError(f"--fold {fold}: give all, or a fold from 0 to {args.folds - 1} (--folds {args.folds})")
    args.fold, args.folds_dir = fold if fold == "all" else int(fold), args.output_dir
    if args.fold != "all":
        args.output_dir = fold_dir(args.folds_dir, args.fold)


def fold_dir(directory: str | Path, fold: int) -> str:
    return str(Path(directory) / f"fold-{fold}")


def temporary_logs(script: str, beside: str | Path) -> Path:
    """The folder of the launcher's logs of predict.sh or run.sh --check in the temporary folder, one for each output
    `beside` (run.sh deletes it at the end)."""
    key = str(Path(beside).resolve())
    return Path(tempfile.gettempdir()) / f"{script}-logs-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def in_workspace(path: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """A relative path that is not here but is in the AI Studio workspace (train_data/datasets/<id>/...)."""
    workspace = aistudio_workspace(env)
    if path and workspace and not Path(path).is_absolute() and not Path(path).exists() and (workspace / path).exists():
        return str(workspace / path)
    return path


def data_url_paths(folder: str, archive_suffixes: tuple[str, ...]) -> tuple[str | None, str | None]:
    """ModelArts's --data_url: (archive, None) for a folder holding one archive, (None, folder) for data."""
    root = Path(folder)
    archives = (
        sorted(p for p in root.iterdir() if p.is_file() and p.name.lower().endswith(archive_suffixes))
        if root.is_dir()
        else []
    )
    if not archives or (root / "train").is_dir():
        return None, folder
    if len(archives) > 1:
        names = ", ".join(p.name for p in archives)
        raise PlatformError(
            f"--data_url {folder} holds several archives ({names}): pass the one to use with --dataset-zip"
        )
    return str(archives[0]), None


def can_write(folder: Path) -> bool:
    """Whether `folder` (or, not there yet, the nearest folder above it) takes new files."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


def writable_target(target: Path) -> tuple[Path, str | None]:
    """Where to extract an archive meant for `target` (beside it): there, unless that cannot be written
    (a platform's read-only dataset folder); then in data/ of the project, or the temporary folder."""
    if target.exists() or can_write(target.parent):
        return target, None
    for folder in (PROJECT_ROOT / "data", Path(tempfile.gettempdir()) / f"{PROJECT_ROOT.name}-data"):
        if can_write(folder):
            moved = folder / target.name
            return moved, f"{target.parent} cannot be written: the dataset archive is extracted into {moved}"
    return target, None  # nowhere better: the extraction itself will say what is wrong


def say_once_per_machine(line: str) -> None:
    """Print `line` from one process per machine: the first of the launcher's, or the one before any."""
    if os.environ.get("LOCAL_RANK", os.environ.get("PADDLE_LOCAL_RANK", "0")) == "0":
        print(line, flush=True)


def resolve_data_paths(args, quiet: bool = False) -> None:
    """Which archive to extract, and where.

    An explicit --data-dir alone means "my data is already there": nothing is extracted.
    An explicit --dataset-zip alone extracts into a folder beside it, named after it (elsewhere, with a
    line saying where, if that folder cannot be written).
    ModelArts's --data_url fills in whichever of the two it holds and the user did not give.
    Neither: the bundled sample's folder, data/<SAMPLE>; in a dataset=zip project the datasets that read it
    extract data/<SAMPLE>.zip there first (archive.dataset_root()). --synthetic needs no data: nothing is extracted.
    """
    if args.data_url:
        archive, folder = data_url_paths(args.data_url, ARCHIVE_SUFFIXES)
        args.dataset_zip = args.dataset_zip or archive
        if args.dataset_zip is None and args.data_dir is None:
            args.data_dir = folder
    args.dataset_zip, args.data_dir = in_workspace(args.dataset_zip), in_workspace(args.data_dir)
    if args.dataset_zip:
        if args.data_dir is None:
            target, note = writable_target(folder_for_archive(Path(args.dataset_zip)))
            args.data_dir = str(target)
            if note and not quiet:
                say_once_per_machine(note)
    elif args.data_dir is None:
        args.data_dir = str(SAMPLE_DATA_DIR)
    if args.synthetic:
        args.dataset_zip = None


def folder_for_archive(archive: Path) -> Path:
    name = archive.name
    for suffix in ARCHIVE_SUFFIXES:
        if name.lower().endswith(suffix):
            return archive.with_name(name[: -len(suffix)])
    return archive.with_name(name + ".data")
