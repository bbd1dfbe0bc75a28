"""Checkpoints: written by global rank 0 only, as a consistent pair; read back on every rank.

DIR/checkpoints/last.pdparams is the model's state dict (paddle.load() it into
any copy of the model); last.pdopt beside it holds everything else needed to
continue: optimizer (with the learning-rate schedule inside), AMP scaler,
epochs done, best accuracy, every rank's RNG states and, after a SIGTERM stop,
how far each rank is into the next epoch. best.* is a copy of the
epoch with the best validation accuracy.

Two files cannot be replaced in one atomic step, so a save goes through a
folder, and a folder rename is atomic:
1. write the new pair (and best.* when this epoch is the best) into .saving/;
2. rename .saving/ to .saved/: the commit point;
3. move each file of .saved/ over its old version, then remove .saved/.
A crash in 1 leaves .saving/, which the next start deletes: the old pair stays.
A crash in 3 leaves .saved/, which the next start moves into place first: the
new pair wins. resume() does that recovery before it reads anything, so a run
never loads weights from one epoch with the optimizer state of another.
"""

import logging
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import paddle

from . import distributed
from .distributed import DistEnv
from .errors import UserError
from .preemption import EpochProgress

log = logging.getLogger(__name__)

LAST, BEST = "last", "best"
WEIGHTS, STATE = ".pdparams", ".pdopt"
SAVING, SAVED = ".saving", ".saved"
STATE_KEYS = ("optimizer", "scaler", "epoch", "best_acc", "rng", "progress")


class Checkpointer:
    """Save and resume the model, optimizer and scaler (None where paddle.Model keeps its own)."""

    def __init__(self, directory: str | Path, env: DistEnv, model, optimizer, scaler=None):
        self.directory = Path(directory)
        self.env = env
        self.model, self.optimizer, self.scaler = model, optimizer, scaler

    @property
    def last_path(self) -> Path:
        return self.directory / (LAST + WEIGHTS)

    def save(self, epoch: int, best_acc: float, is_best: bool, progress: EpochProgress | None = None) -> None:
        """Save after `epoch` epochs, plus `progress` into the next when a stop interrupts it.

        Called on every rank (RNG states and progress are gathered); only rank 0 writes.
        """
        per_rank = distributed.all_gather_object((capture_rng(), (progress or EpochProgress()).to_dict()))
        if not self.env.is_main:
            return
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": epoch,
            "best_acc": best_acc,
            "rng": [rng for rng, _ in per_rank],
            "progress": [rank_progress for _, rank_progress in per_rank],
        }
        staging = self.directory / SAVING
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            save_synced(distributed.unwrap(self.model).state_dict(), staging / (LAST + WEIGHTS))
            save_synced(state, staging / (LAST + STATE))
            if is_best:
                for suffix in (WEIGHTS, STATE):
                    shutil.copyfile(staging / (LAST + suffix), staging / (BEST + suffix))
            staging.rename(self.directory / SAVED)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # a failed save (disk full, ...) leaves nothing behind
        move_saved_into_place(self.directory)

    def resume(self, how: str) -> tuple[int, float, EpochProgress]:
        """Load the checkpoint `how` names (auto, none or a path).

        Returns the epochs done, the best accuracy and this rank's progress into the next
        epoch. Every rank loads it, and all must find the same point: a machine that cannot
        see the checkpoint would otherwise start afresh and train a different model.
        """
        if self.env.is_main:
            finish_interrupted_save(self.directory)
        distributed.barrier()
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
        weights_path, state_path = path.with_suffix(WEIGHTS), path.with_suffix(STATE)
        if not weights_path.exists():
            if how == "auto":
                return 0, 0.0, EpochProgress()
            raise UserError(
                f"checkpoint {weights_path} not found: pass --resume auto, none, or an existing .pdparams file"
            )
        if not state_path.exists():
            raise UserError(
                f"{weights_path} is not a checkpoint written by run.py (it has no {state_path.name} beside it): "
                f"pass --resume with a {LAST}{WEIGHTS} or {BEST}{WEIGHTS}, or start in a new --output-dir "
                "(to start from these weights, set_state_dict() them in build_model())"
            )
        weights, state = load_file(weights_path), load_file(state_path)
        if not isinstance(weights, dict) or not isinstance(state, dict) or not all(key in state for key in STATE_KEYS):
            raise UserError(
                f"{weights_path} is not a checkpoint written by run.py ({state_path.name} needs {', '.join(STATE_KEYS)}): "
                f"pass --resume with a {LAST}{WEIGHTS} or {BEST}{WEIGHTS}, or start in a new --output-dir"
            )
        model = distributed.unwrap(self.model)
        problem = mismatch(model.state_dict(), weights)
        if problem:
            raise UserError(
                f"checkpoint {weights_path} does not match the model ({problem}): use a new --output-dir for a new model"
            )
        model.set_state_dict(weights)
        self.optimizer.set_state_dict(state["optimizer"])
        if self.scaler is not None and state["scaler"] is not None:
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
            log.info("resumed from %s (epoch %d, step %d)", weights_path, state["epoch"] + 1, progress.step)
        else:
            log.info("resumed from %s (epoch %d)", weights_path, state["epoch"])
        return state["epoch"], state["best_acc"], progress


def save_synced(obj, path: Path) -> None:
    """paddle.save, then wait until the bytes are on disk: the rename that follows must not outrun them."""
    paddle.save(obj, str(path))
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def move_saved_into_place(directory: Path) -> None:
    saved = directory / SAVED
    for path in sorted(saved.iterdir()):
        os.replace(path, directory / path.name)
    saved.rmdir()


def finish_interrupted_save(directory: Path) -> None:
    """Complete a committed save, or drop an uncommitted one, that a crash interrupted."""
    if (directory / SAVED).is_dir():
        log.warning("completing the checkpoint save that was interrupted in %s", directory)
        move_saved_into_place(directory)
    shutil.rmtree(directory / SAVING, ignore_errors=True)


def load_file(path: Path):
    try:
        return paddle.load(str(path))
    except (ValueError, EOFError, OSError, pickle.UnpicklingError) as error:
        raise UserError(
            f"checkpoint {path} is corrupt or unreadable ({error.__class__.__name__}): continue from another one "
            f"with --resume {path.with_name(BEST + WEIGHTS)}, or start in a new --output-dir"
        ) from None


def mismatch(expected: dict, saved: dict) -> str | None:
    """The first difference between the model's state dict and a saved one, in words; None if they fit."""
    for key, value in expected.items():
        if key not in saved:
            return f"{key} is missing from the checkpoint"
        saved_shape, model_shape = list(saved[key].shape), list(value.shape)
        if saved_shape != model_shape:
            return f"size mismatch for {key}: {saved_shape} in the checkpoint, {model_shape} in the model"
    extra = sorted(saved.keys() - expected.keys())
    return f"{extra[0]} is not in the model" if extra else None


def capture_rng() -> dict:
    name, keys, *rest = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), *rest),  # a list: paddle.save would turn the uint32 array into a tensor
        "paddle": paddle.get_rng_state("cpu"),
        "gpu": paddle.get_rng_state("gpu") if distributed.gpu_available() else [],
    }


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    paddle.set_rng_state(state["paddle"], "cpu")
    if state["gpu"] and distributed.gpu_available():
        paddle.set_rng_state(state["gpu"], "gpu")
