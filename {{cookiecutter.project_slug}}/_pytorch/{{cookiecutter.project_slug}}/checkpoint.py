"""Checkpoints: written by global rank 0 only, atomically; read back on every rank.

DIR/checkpoints/last.pt holds everything needed to continue (model, optimizer,
scheduler, AMP scaler, epochs done, best accuracy, every rank's RNG states,
and, after a SIGTERM stop, how far each rank is into the next epoch);
best.pt is a copy of the epoch with the best validation accuracy. Files are
written to a temporary name and os.replace()d, so a crash mid-save leaves the
previous checkpoint intact. They load with torch.load(weights_only=True).
"""

import logging
import os
import pickle
import random
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

from . import distributed
from .distributed import DistEnv
from .errors import UserError
from .preemption import EpochProgress

log = logging.getLogger(__name__)

LAST, BEST = "last.pt", "best.pt"
STATE_KEYS = ("model", "optimizer", "scheduler", "scaler", "epoch", "best_acc", "rng", "progress")


class Checkpointer:
    def __init__(self, directory: str | Path, env: DistEnv, model, optimizer, scheduler, scaler):
        self.directory = Path(directory)
        self.env = env
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler

    @property
    def last_path(self) -> Path:
        return self.directory / LAST

    def save(self, epoch: int, best_acc: float, is_best: bool, progress: EpochProgress | None = None) -> None:
        """Save after `epoch` epochs, plus `progress` into the next when a stop interrupts it.

        Called on every rank (RNG states and progress are gathered); only rank 0 writes.
        """
        per_rank = distributed.all_gather_object((capture_rng(), (progress or EpochProgress()).to_dict()))
        if not self.env.is_main:
            return
        state = {
            "model": distributed.unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": epoch,
            "best_acc": best_acc,
            "rng": [rng for rng, _ in per_rank],
            "progress": [rank_progress for _, rank_progress in per_rank],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_save(state, self.last_path)
        if is_best:
            atomic_copy(self.last_path, self.directory / BEST)

    def resume(self, how: str) -> tuple[int, float, EpochProgress]:
        """Load the checkpoint `how` names (auto, none or a path).

        Returns the epochs done, the best accuracy and this rank's progress into the next
        epoch. Every rank loads it, and all must find the same point: a machine that cannot
        see the checkpoint would otherwise start afresh and train a different model.
        """
        epoch, best_acc, progress = self._load(how)
        points = distributed.all_gather_object((epoch, progress.step))
        if len(set(points)) > 1:
            raise UserError(
                f"ranks found checkpoints of different epochs ({[epoch for epoch, _ in points]}) in {self.directory}: "
                "give every machine the same --output-dir on a shared filesystem, or copy the checkpoints to each"
            )
        return epoch, best_acc, progress

    def _load(self, how: str) -> tuple[int, float, EpochProgress]:
        if how == "none":
            return 0, 0.0, EpochProgress()
        path = self.last_path if how == "auto" else Path(how)
        if not path.exists():
            if how == "auto":
                return 0, 0.0, EpochProgress()
            raise UserError(f"checkpoint {path} not found: pass --resume auto, none, or an existing file")
        state = load_checkpoint(path, self.env.device)
        try:
            distributed.unwrap(self.model).load_state_dict(state["model"])
        except RuntimeError as error:
            detail = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
            raise UserError(
                f"checkpoint {path} does not match the model ({detail}): use a new --output-dir for a new model"
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        progress = EpochProgress()
        if len(state["rng"]) == self.env.world_size:
            restore_rng(state["rng"][self.env.rank])
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
        return state["epoch"], state["best_acc"], progress


def load_checkpoint(path: Path, device: torch.device) -> dict:
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


def atomic_save(state: dict, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # a failed save (disk full, ...) leaves no half-written file


def atomic_copy(source: Path, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        shutil.copyfile(source, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def capture_rng() -> dict:
    numpy_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
