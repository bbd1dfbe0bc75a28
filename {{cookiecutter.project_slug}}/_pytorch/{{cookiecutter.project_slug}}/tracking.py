"""Curves for TensorBoard: rank 0 writes them under OUTPUT_DIR/tensorboard/ (`tensorboard --logdir OUTPUT_DIR`).

Two runs, each its own event files: tensorboard/steps/ holds the training loss at each
logged optimizer step (tag train/loss), tensorboard/epochs/ the numbers of each
metrics.jsonl line at step = epoch (tags epoch/val_loss, ...). A resumed run writes on
in the same folders, and TensorBoard drops what a killed run wrote past the checkpoint
(purge_step), so the curves continue without repeats. Separate runs, because one purge
step per file applies to all its tags, and epochs and steps count differently.

The writer (torch.utils.tensorboard, from the tensorboard package) is imported on rank 0
only, at the first record: a run pays nothing for it before then, other ranks never.
"""

from .logs import TrackerBase

FLUSH_SECS = 10  # someone watching sees the loss within this long


class Tracker(TrackerBase):
    PACKAGE = FOLDER = "tensorboard"

    def _writer(self, run: str):
        if run not in self.writers:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides what earlier files of this run hold from that step on.
            self.writers[run] = SummaryWriter(
                str(self.directory / run), purge_step=self.start[run] + 1, flush_secs=FLUSH_SECS
            )
        return self.writers[run]
