"""Logging and metrics: rank 0 to the console and train.log, other ranks to their own files."""

import json
import logging
import sys
from pathlib import Path

PACKAGE_LOGGER = logging.getLogger(__package__)


def setup_logging(output_dir: str | Path, rank: int) -> logging.Logger:
    output_dir = Path(output_dir)
    if rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        handlers = [logging.StreamHandler(sys.stdout), logging.FileHandler(output_dir / "train.log")]
    else:
        rank_dir = output_dir / "logs"
        rank_dir.mkdir(parents=True, exist_ok=True)
        handlers = [logging.FileHandler(rank_dir / f"rank{rank}.log")]
    formatter = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")
    PACKAGE_LOGGER.handlers.clear()
    for handler in handlers:
        handler.setFormatter(formatter)
        PACKAGE_LOGGER.addHandler(handler)
    PACKAGE_LOGGER.setLevel(logging.INFO)
    PACKAGE_LOGGER.propagate = False
    return PACKAGE_LOGGER


def append_metrics(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")


def drop_metrics_after(path: Path, epoch: int) -> None:
    """Forget epochs a checkpoint does not cover, so a resumed run never logs one twice."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if (recorded := epoch_of(line)) is not None and recorded <= epoch]
    if len(kept) != len(lines):
        path.write_text("".join(kept), encoding="utf-8")


def epoch_of(line: str) -> int | None:
    """The epoch a metrics line records; None for a line torn by a crash mid-write."""
    try:
        return json.loads(line)["epoch"]
    except (ValueError, KeyError, TypeError):
        return None
