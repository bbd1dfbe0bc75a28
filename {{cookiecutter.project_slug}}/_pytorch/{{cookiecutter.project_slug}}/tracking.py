"""Curves for TensorBoard: rank 0 writes them under OUTPUT_DIR/tensorboard/ (`tensorboard --logdir OUTPUT_DIR`).

Two runs, each its own event files: tensorboard/steps/ holds the training loss at each
logged optimizer step (tag train/loss), tensorboard/epochs/ the numbers of each
metrics.jsonl line at step = epoch (tags epoch/val_acc, ...). A resumed run writes on
in the same folders, and TensorBoard drops what a killed run wrote past the checkpoint
(purge_step), so the curves continue without repeats. Separate runs, because one purge
step per file applies to all its tags, and epochs and steps count differently.

The writer (torch.utils.tensorboard, from the tensorboard package) is imported on rank 0
only, at the first record: a run pays nothing for it before then, other ranks never.
"""

import importlib.util
from pathlib import Path

from .errors import UserError

PACKAGE = "tensorboard"
FOLDER = "tensorboard"
FLUSH_SECS = 10  # someone watching sees the loss within this long


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
        self.start = {"steps": start_step, "epochs": start_epoch}
        self.writers: dict = {}
        if self.active and importlib.util.find_spec(PACKAGE) is None:
            raise UserError(f"tracking needs the {PACKAGE} package: pip install {PACKAGE}, or pass --no-tracking")

    def loss(self, step: int, value: float) -> None:
        """The training loss at optimizer step `step` (see optimizer_step())."""
        if self.active:
            self._writer("steps").add_scalar("train/loss", value, step)

    def epoch(self, epoch: int, record: dict) -> None:
        """A metrics.jsonl record: each number in it at step = epoch; then everything is on disk."""
        if not self.active:
            return
        writer = self._writer("epochs")
        for key, value in record.items():
            if key != "epoch" and isinstance(value, int | float) and not isinstance(value, bool):
                writer.add_scalar(f"epoch/{key}", value, epoch)
        for writer in self.writers.values():
            writer.flush()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()

    def _writer(self, run: str):
        if run not in self.writers:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides what earlier files of this run hold from that step on.
            self.writers[run] = SummaryWriter(
                str(self.directory / run), purge_step=self.start[run] + 1, flush_secs=FLUSH_SECS
            )
        return self.writers[run]
