"""Curves for VisualDL: rank 0 writes them under OUTPUT_DIR/visualdl/ (`visualdl --logdir OUTPUT_DIR`).

One records file, visualdl/vdlrecords.run.log: the training loss at each logged optimizer
step (tag train/loss), and the numbers of each metrics.jsonl line at step = epoch (tags
epoch/val_loss, ...). VisualDL shows one file per folder, the newest, so a resumed run
appends to the same file; first it drops what a killed run wrote past the checkpoint
(steps after start_step, epochs after start_epoch), so the curves continue without repeats.

The writer (visualdl's LogWriter) is imported on rank 0 only, at the first record: a run
pays nothing for it before then, other ranks never.
"""

import contextlib
import io
import os
import struct
from pathlib import Path

from .logs import TrackerBase

_RECORDS = "vdlrecords.run.log"  # VisualDL reads files whose names hold "vdlrecords"
FLUSH_SECS = 10  # someone watching sees the loss within this long
_STEP_TAGS = ("train/",)  # tags counted in optimizer steps; the others in epochs


class Tracker(TrackerBase):
    PACKAGE = FOLDER = "visualdl"

    def _writer(self, run: str):
        """One writer for steps and epochs alike: VisualDL shows one records file per folder."""
        if not self.writers:
            from visualdl import LogWriter

            path = self.directory / _RECORDS
            if path.exists():
                _drop_records_after(path, self.start["steps"], self.start["epochs"])
            with contextlib.redirect_stdout(io.StringIO()):  # "... VisualDL will add logs to it."
                self.writers["records"] = LogWriter(
                    logdir=str(self.directory), file_name=_RECORDS, flush_secs=FLUSH_SECS
                )
        return self.writers["records"]


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
