"""Logging and metrics: rank 0 to the console and train.log, other ranks to their own files."""

import json
import logging
import sys
import time
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


def epoch_record(
    epoch: int,
    train_stats: dict,
    val_stats: dict,
    *,
    lr: float,
    world_size: int,
    global_batch_size: int,
    started: float,
) -> dict:
    """The metrics.jsonl line of a finished epoch (the keys README.md lists)."""
    return {
        "epoch": epoch,
        "train_loss": train_stats["loss"],
        "val_loss": val_stats["loss"],
        "val_acc": val_stats["acc"],
        "world_size": world_size,
        "global_batch_size": global_batch_size,
        "train_samples": train_stats["samples"],
        "val_samples": val_stats["samples"],
        "epoch_time_s": round(time.perf_counter() - started, 3),
        "lr": lr,
    }


def report_epoch(metrics_path: Path, record: dict, epochs: int, is_main: bool) -> None:
    """Rank 0 appends the record to metrics.jsonl; every rank logs it (rank 0's log is the console)."""
    if is_main:
        append_metrics(metrics_path, record)
    PACKAGE_LOGGER.info(
        "epoch %d/%d train_loss %.4f val_loss %.4f val_acc %.4f (%.1f s)",
        record["epoch"], epochs, record["train_loss"], record["val_loss"], record["val_acc"], record["epoch_time_s"],
    )  # fmt: skip


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
