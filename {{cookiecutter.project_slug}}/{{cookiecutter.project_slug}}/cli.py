"""Command-line flags of run.py; the same for every framework and launcher."""

import argparse
from pathlib import Path

from .settings import DATASET, FRAMEWORK

# Defaults are anchored to the project folder, so `python /path/to/run.py` works from anywhere.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA_DIR = PROJECT_ROOT / "data" / "digits"
SAMPLE_ARCHIVE = PROJECT_ROOT / "data" / "digits.zip"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
TRACKER = "TensorBoard" if FRAMEWORK == "pytorch" else "VisualDL"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train on one process, or many with a launcher (see run.sh).")
    parser.add_argument(
        "--epochs", type=positive_int, default=10, help="epochs in total; a resumed run continues up to this"
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        help="batch size PER PROCESS; the global batch is this x world size x --grad-accum",
    )
    parser.add_argument(
        "--lr", type=float, default=0.05, help="learning rate for the global batch (not scaled for you)"
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed; rank r seeds its own randomness with seed + r")
    parser.add_argument(
        "--output-dir", default=str(PROJECT_ROOT / "output"), help="checkpoints, logs and metrics.jsonl go here"
    )
    parser.add_argument(
        "--resume",
        default="auto",
        help="auto: continue from OUTPUT_DIR/checkpoints/last.* if present; none: start afresh; or a checkpoint path",
    )
    parser.add_argument(
        "--synthetic",
        action=argparse.BooleanOptionalAction,
        default=DATASET == "synthetic",
        help="random data of the right shapes instead of the dataset",
    )
    parser.add_argument(
        "--data-dir",
        help="the unpacked dataset, train/<class>/* and val/<class>/* (default: data/digits, "
        "or a folder beside --dataset-zip named after it)",
    )
    parser.add_argument(
        "--dataset-zip",
        help="archive (.zip, .tar, .tar.gz) extracted into --data-dir once per node before training"
        + (" (default: data/digits.zip, unless --data-dir is given)" if DATASET == "zip" else ""),
    )
    parser.add_argument(
        "--device", choices=("auto", "cpu", "gpu"), default="auto", help="auto: a GPU where there is one"
    )
    parser.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True, help="mixed precision on GPU")
    parser.add_argument("--workers", type=non_negative_int, default=0, help="data-loading worker processes per rank")
    parser.add_argument("--log-every", type=positive_int, default=50, help="steps between loss log lines")
    parser.add_argument(
        "--tracking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"rank 0 writes the loss and the epoch metrics for {TRACKER} under OUTPUT_DIR/{TRACKER.lower()}/",
    )
    parser.add_argument(
        "--dist-timeout",
        type=float,
        default=1800.0,
        help="seconds a rank waits for its peers (start-up and each collective) before stopping with an error",
    )
    parser.add_argument(
        "--find-unused-parameters",
        action="store_true",
        help="for models with parameters that get no gradient in some steps (slower)",
    )
    parser.add_argument(
        "--archive-max-gb",
        type=float,
        default=100.0,
        help="refuse archives that declare more uncompressed data than this (zip bombs)",
    )
    parser.add_argument(
        "--extract-timeout",
        type=float,
        default=3600.0,
        help="seconds to wait for another process (or machine, on a shared filesystem) that is extracting the archive",
    )
    # torch.distributed.launch passes --local-rank (or --local_rank on old versions);
    # the LOCAL_RANK variable it also sets is what the code reads.
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    resolve_data_paths(args)
    return args


def resolve_data_paths(args: argparse.Namespace) -> None:
    """Which archive to extract, and where.

    An explicit --data-dir alone means "my data is already there": nothing is extracted.
    An explicit --dataset-zip alone extracts into a folder beside it, named after it.
    Neither: the bundled sample (data/digits.zip into data/digits) in a dataset=zip project.
    """
    if args.dataset_zip:
        if args.data_dir is None:
            args.data_dir = str(folder_for_archive(Path(args.dataset_zip)))
    elif args.data_dir is None:
        args.data_dir = str(SAMPLE_DATA_DIR)
        if DATASET == "zip":
            args.dataset_zip = str(SAMPLE_ARCHIVE)


def folder_for_archive(archive: Path) -> Path:
    name = archive.name
    for suffix in ARCHIVE_SUFFIXES:
        if name.lower().endswith(suffix):
            return archive.with_name(name[: -len(suffix)])
    return archive.with_name(name + ".data")
