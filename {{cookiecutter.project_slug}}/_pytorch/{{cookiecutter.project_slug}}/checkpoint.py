"""Checkpoints: written by global rank 0 only, atomically; read back on every rank.

The Checkpointer owns where training stands (a TrainingState): it decides which
epoch is the best, keeps how far a stopped epoch got, and puts the learning-rate
schedule back on resume. DIR/checkpoints/last.pt holds everything needed to
continue (model, optimizer, scheduler, AMP scaler, epochs done, best accuracy,
every rank's RNG states and, after a SIGTERM stop, how far each rank is into the
next epoch); best.pt is a copy of the epoch with the best validation accuracy.
Files are written to a temporary name and os.replace()d, so a crash mid-save
leaves the previous checkpoint intact. They load with torch.load(weights_only=True).
"""

import logging
import os
import pickle
import random
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from . import distributed
from .distributed import DistEnv
from .errors import UserError
from .preemption import Stopped
from .state import EpochProgress, TrainingState

log = logging.getLogger(__name__)

LAST, BEST = "last.pt", "best.pt"
STATE_KEYS = ("model", "optimizer", "scheduler", "scaler", "epoch", "best_acc", "rng", "progress")


class Checkpointer:
    """Save and resume the model, optimizer, schedule and scaler (None where the framework keeps its own)."""

    def __init__(self, directory: str | Path, env: DistEnv, model, optimizer, scheduler, scaler=None):
        self.directory = Path(directory)
        self.env = env
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.state = TrainingState()

    @property
    def last_path(self) -> Path:
        return self.directory / LAST

    def end_epoch(self, epoch: int, val_acc: float) -> None:
        """Record a finished epoch and save it (last, and best when it is the best); on every rank."""
        is_best = self.state.finish_epoch(epoch, val_acc)
        self._save(self.state, is_best)

    def save_stopped(self, stopped: Stopped) -> None:
        """Save how far the stopped epoch got; on every rank. A stop at an epoch's end has nothing new to save."""
        if stopped.progress.step:
            self._save(replace(self.state, progress=stopped.progress), is_best=False)

    def _save(self, state: TrainingState, is_best: bool) -> None:
        # Every rank's RNG states and progress are gathered; only rank 0 writes.
        per_rank = distributed.all_gather_object((_capture_rng(), state.progress.to_dict()))
        if not self.env.is_main:
            return
        checkpoint = {
            "model": distributed.unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": state.epochs_done,
            "best_acc": state.best_acc,
            "rng": [rng for rng, _ in per_rank],
            "progress": [rank_progress for _, rank_progress in per_rank],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        _atomic_save(checkpoint, self.last_path)
        if is_best:
            _atomic_copy(self.last_path, self.directory / BEST)

    def resume(self, how: str) -> TrainingState:
        """Load the checkpoint `how` names (auto, none or a path) and return where training stands.

        Every rank loads it, and all must find the same point: a machine that cannot see the
        checkpoint would otherwise start afresh and train a different model.
        """
        self.state = self._load(how)
        points = distributed.all_gather_object((self.state.epochs_done, self.state.progress.step))
        if len(set(points)) > 1:
            raise UserError(
                f"ranks found checkpoints of different epochs ({[epoch for epoch, _ in points]}) in {self.directory}: "
                "give every machine the same --output-dir on a shared filesystem, or copy the checkpoints to each"
            )
        _reapply_schedule(self.scheduler)
        return self.state

    def _load(self, how: str) -> TrainingState:
        if how == "none":
            return TrainingState()
        path = self.last_path if how == "auto" else Path(how)
        if not path.exists():
            if how == "auto":
                return TrainingState()
            raise UserError(f"checkpoint {path} not found: pass --resume auto, none, or an existing file")
        state = _load_checkpoint(path, self.env.device)
        try:
            distributed.unwrap(self.model).load_state_dict(state["model"])
        except RuntimeError as error:
            detail = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
            raise UserError(
                f"checkpoint {path} does not match the model ({detail}): use a new --output-dir for a new model"
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        progress = EpochProgress()
        if len(state["rng"]) == self.env.world_size:
            _restore_rng(state["rng"][self.env.rank])
            progress = EpochProgress(**state["progress"][self.env.rank])
        else:
            log.warning(
                "world size changed from %d to %d: random streams start afresh, and a stopped epoch from its start",
                len(state["rng"]), self.env.world_size,
            )  # fmt: skip
        if progress.step:
            log.info("resumed from %s (epoch %d, step %d)", path, state["epoch"] + 1, progress.step)
        else:
            log.info("resumed from %s (epoch %d)", path, state["epoch"])
        return TrainingState(state["epoch"], state["best_acc"], progress)


def _reapply_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set the learning rate the schedule gives at its current epoch.

    After a resume the optimizer holds the rate of the saved run's schedule, which a
    larger --epochs has changed.
    """
    for group, base_lr, factor in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        group["lr"] = base_lr * factor(scheduler.last_epoch)


def _load_checkpoint(path: Path, device: torch.device) -> dict:
    try:
        # weights_only: a checkpoint can hold tensors and plain data, never code.
        state = torch.load(path, map_location=device, weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise UserError(
            f"checkpoint {path} is corrupt or unreadable ({error.__class__.__name__}): continue from another one "
            f"with --resume {path.with_name(BEST)}, or start in a new --output-dir"
        ) from None
    if not isinstance(state, dict) or not all(key in state for key in STATE_KEYS):
        raise UserError(
            f"{path} is not a checkpoint written by run.py (it needs {', '.join(STATE_KEYS)}): "
            "pass --resume with a last.pt or best.pt, or start in a new --output-dir"
        )
    return state


def _atomic_save(state: dict, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # a failed save (disk full, ...) leaves no half-written file


def _atomic_copy(source: Path, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        shutil.copyfile(source, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _capture_rng() -> dict:
    numpy_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
