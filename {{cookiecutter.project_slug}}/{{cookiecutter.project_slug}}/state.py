"""Where training stands, the part of a checkpoint that is the same for every framework."""

from dataclasses import asdict, dataclass, field


@dataclass
class EpochProgress:
    """How far this rank is into an epoch: the batches it has trained on, their loss sum and sample count."""

    step: int = 0
    loss_sum: float = 0.0
    seen: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainingState:
    """Epochs done, the best validation accuracy so far, and this rank's progress into the next epoch."""

    epochs_done: int = 0
    best_acc: float = 0.0
    progress: EpochProgress = field(default_factory=EpochProgress)

    def finish_epoch(self, epoch: int, val_acc: float) -> bool:
        """Record a finished epoch; True when its accuracy is the best so far (ties keep the earlier best)."""
        is_best = val_acc > self.best_acc
        self.epochs_done, self.best_acc, self.progress = epoch, max(self.best_acc, val_acc), EpochProgress()
        return is_best
