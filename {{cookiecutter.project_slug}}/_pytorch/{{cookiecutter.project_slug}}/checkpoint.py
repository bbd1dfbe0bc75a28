"""Checkpoints: written by global rank 0 only, atomically; read back on every rank.

DIR/checkpoints/last.pt holds everything needed to continue (model, optimizer,
scheduler, AMP scaler, epochs done, the best metric's name, direction and value, every
rank's RNG states and, after a SIGTERM stop, how far each rank is into the next epoch);
best.pt is a copy of the epoch with the best value of task.py's BEST_METRIC. Files are written to a temporary
name and os.replace()d, so a crash mid-save leaves the previous checkpoint intact.
They load with torch.load(weights_only=True). What is the same in Paddle (the
training state, the best epoch, resuming on every rank) is state.CheckpointerBase.
"""

import os
import pickle
import random
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

from . import distributed
from .errors import UserError
from .state import CheckpointerBase

LAST, BEST = "last.pt", "best.pt"
STATE_KEYS = ("model", "optimizer", "scheduler", "scaler", "epoch", "rng", "progress")


class Checkpointer(CheckpointerBase):
    @property
    def last_path(self) -> Path:
        return self.directory / LAST

    def _write(self, training: dict, is_best: bool) -> None:
        checkpoint = {
            "model": distributed.unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            **training,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        _atomic_save(checkpoint, self.last_path)
        if is_best:
            _atomic_copy(self.last_path, self.directory / BEST)

    def _init_weights(self, path: Path) -> None:
        model = distributed.unwrap(self.model)
        fitting = self._fitting(model.state_dict(), read_weights(path)[0], path)
        model.load_state_dict(fitting, strict=False)

    def _read(self, how: str) -> tuple[Path, dict] | None:
        """The checkpoint `how` names, loaded into the model, optimizer, scheduler and scaler; None: start afresh."""
        if how == "none":
            return None
        path = self.last_path if how == "auto" else Path(how)
        if not path.exists():
            if how == "auto":
                return None
            raise UserError(f"checkpoint {path} not found: pass --resume auto, none, or an existing file")
        checkpoint = _load_checkpoint(path)
        try:
            distributed.unwrap(self.model).load_state_dict(checkpoint["model"])
        except RuntimeError as error:
            detail = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
            raise UserError(
                f"checkpoint {path} does not match the model ({detail}): use a new --output-dir for a new model"
            ) from None
        self.optimizer.load_state_dict(checkpoint["optimizer"])  # moves its state to the parameters' device
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        # A run without loss scaling (CPU, --no-amp, bfloat16) saved {}: the scaler starts afresh then.
        if self.scaler is not None and checkpoint["scaler"]:
            self.scaler.load_state_dict(checkpoint["scaler"])
        return path, checkpoint

    def _reapply_schedule(self) -> None:
        """Set the learning rate the schedule gives at its current epoch.

        After a resume the optimizer holds the rate of the saved run's schedule, which a
        larger --epochs has changed.
        """
        scheduler = self.scheduler
        for group, base_lr, factor in zip(
            scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
        ):
            group["lr"] = base_lr * factor(scheduler.last_epoch)

    def _base_lr(self) -> float:
        return self.scheduler.base_lrs[0]

    def _set_base_lr(self, lr: float) -> None:
        self.scheduler.base_lrs = [lr] * len(self.scheduler.base_lrs)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr

    def _schedule_factor(self) -> float:
        return self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)

    def _capture_rng(self) -> dict:
        """This rank's random streams: of this rank's own GPU only (a CPU run never touches CUDA), so the
        checkpoint resumes on a machine that sees another number of GPUs, or none."""
        numpy_state = np.random.get_state()
        return {
            "python": random.getstate(),
            "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(self.env.device) if self.env.on_gpu else None,
        }

    def _restore_rng(self, state: dict) -> None:
        random.setstate(state["python"])
        name, keys, *rest = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        torch.set_rng_state(state["torch"])
        # A GPU stream saved on the CPU, or none saved on a GPU: that stream goes on from its seed.
        if state["cuda"] is not None and self.env.on_gpu:
            torch.cuda.set_rng_state(state["cuda"], self.env.device)


def _load_checkpoint(path: Path) -> dict:
    try:
        # weights_only: a checkpoint can hold tensors and plain data, never code. Onto the CPU: each piece goes
        # where it belongs from there (load_state_dict() moves weights and optimizer state to the model's device),
        # and a checkpoint written on GPUs loads on a machine without one.
        state = torch.load(path, map_location="cpu", weights_only=True)
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


def read_weights(checkpoint: Path) -> tuple[dict, dict]:
    """The model weights and the data description (images.data_description()) of a checkpoint, or of a bare state dict."""
    if not checkpoint.is_file():
        raise UserError(f"checkpoint {checkpoint} not found: pass a last.pt or best.pt from OUTPUT_DIR/checkpoints/")
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)  # the caller moves what it keeps
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise UserError(f"checkpoint {checkpoint} is corrupt or unreadable ({error.__class__.__name__})") from None
    weights = state.get("model", state) if isinstance(state, dict) else None
    if not isinstance(weights, dict) or not weights:
        raise UserError(f"{checkpoint} holds no model weights: pass a last.pt or best.pt that run.py wrote")
    return weights, state.get("data") or {}


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
