"""Curves for VisualDL: rank 0 writes them under OUTPUT_DIR/visualdl/ (`visualdl --logdir OUTPUT_DIR`).

One records file, visualdl/vdlrecords.run.log: the training loss at each logged optimizer
step (tag train/loss), and the numbers of each metrics.jsonl line at step = epoch (tags
epoch/val_acc, ...). VisualDL shows one file per folder, the newest, so a resumed run
appends to the same file; first it drops what a killed run wrote past the checkpoint
(steps after start_step, epochs after start_epoch), so the curves continue without repeats.

The writer (visualdl's LogWriter) is imported on rank 0 only, at the first record: a run
pays nothing for it before then, other ranks never.
"""

import contextlib
import importlib.util
import io
import os
import struct
from pathlib import Path

from .errors import UserError

PACKAGE = "visualdl"
FOLDER = "visualdl"
_RECORDS = "vdlrecords.run.log"  # VisualDL reads files whose names hold "vdlrecords"
FLUSH_SECS = 10  # someone watching sees the loss within this long
_STEP_TAGS = ("train/",)  # tags counted in optimizer steps; the others in epochs


def optimizer_step(epoch: int, batch: int, batches_per_epoch: int, grad_accum: int) -> int:
    """Optimizer steps taken since the run began, once `batch` batches of `epoch` (1-based) are done."""
    per_epoch = -(-batches_per_epoch // grad_accum)  # the last, shorter accumulation steps too
    return (epoch - 1) * per_epoch + -(-batch // grad_accum)


class Tracker:
    """Rank 0's curves; a no-op on other ranks and with enabled=False (--no-tracking).

    start_step and start_epoch say where the run resumes (optimizer steps and epochs already
    done, 0 for a fresh run): anything recorded beyond them earlier is dropped.
    """

    def __init__(self, output_dir: str | Path, env, enabled: bool = True, start_step: int = 0, start_epoch: int = 0):
        self.active = enabled and env.is_main
        self.directory = Path(output_dir) / FOLDER
        self.start_step, self.start_epoch = start_step, start_epoch
        self.writer = None
        if self.active and importlib.util.find_spec(PACKAGE) is None:
            raise UserError(f"tracking needs the {PACKAGE} package: pip install {PACKAGE}, or pass --no-tracking")

    def loss(self, step: int, value: float) -> None:
        """The training loss at optimizer step `step` (see optimizer_step())."""
        if self.active:
            self._writer().add_scalar("train/loss", float(value), step)

    def epoch(self, epoch: int, record: dict) -> None:
        """A metrics.jsonl record: each number in it at step = epoch; then everything is on disk."""
        if not self.active:
            return
        writer = self._writer()
        for key, value in record.items():
            if key != "epoch" and isinstance(value, int | float) and not isinstance(value, bool):
                writer.add_scalar(f"epoch/{key}", float(value), epoch)
        writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _writer(self):
        if self.writer is None:
            from visualdl import LogWriter

            path = self.directory / _RECORDS
            if path.exists():
                _drop_records_after(path, self.start_step, self.start_epoch)
            with contextlib.redirect_stdout(io.StringIO()):  # "... VisualDL will add logs to it."
                self.writer = LogWriter(logdir=str(self.directory), file_name=_RECORDS, flush_secs=FLUSH_SECS)
        return self.writer


def _drop_records_after(path: Path, last_step: int, last_epoch: int) -> None:
    """Rewrite a records file without the scalars past the checkpoint (and a record torn by a crash)."""
    from visualdl.proto.record_pb2 import Record

    data = path.read_bytes()
    kept, offset, dropped = [], 0, False
    while offset + 8 <= len(data):  # each record: its length (8 bytes, little-endian), then its bytes
        (length,) = struct.unpack_from("<Q", data, offset)
        end = offset + 8 + length
        if end > len(data):
            break
        record = Record()
        record.ParseFromString(data[offset + 8 : end])
        if any(_past(value.tag, value.id, last_step, last_epoch) for value in record.values):  # id: the step
            dropped = True
        else:
            kept.append(data[offset:end])
        offset = end
    if dropped or offset != len(data):
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(b"".join(kept))
        os.replace(temporary, path)


def _past(tag: str, step: int, last_step: int, last_epoch: int) -> bool:
    """True for a scalar a resumed run records again."""
    if tag.startswith(_STEP_TAGS):
        return step > last_step
    return tag.startswith("epoch/") and step > last_epoch
