"""Checkpoints: written by global rank 0 only, atomically (a sharded model's: by every rank); read back on every rank.

DIR/checkpoints/last.pt holds everything needed to continue (model, optimizer,
scheduler, AMP scaler, epochs done, the best metric's name, direction and value, every
rank's RNG states and, after a SIGTERM stop, how far each rank is into the next epoch);
best.pt is a copy of the epoch with the best value of task.py's BEST_METRIC. Files are written to a temporary
name and os.replace()d, so a crash mid-save leaves the previous checkpoint intact.
They load with torch.load(weights_only=True). What is the same in Paddle (the
training state, the best epoch, resuming on every rank) is state.CheckpointerBase.

A sharded model (--strategy fsdp, hsdp) saves no single file: each rank writes its shards of the model and
optimizer into a new folder (torch.distributed.checkpoint), rank 0 adds training.pt (the rest, written last:
a folder without it is incomplete), and then points the link DIR/checkpoints/last (and best) at the folder, a
switch as whole as os.replace(). Either form resumes under either strategy, on any number of processes.
"""

import contextlib
import logging
import os
import pickle
import random
import shutil
import threading
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from . import distributed, fsdp, output_folder
from .errors import UserError
from .state import CheckpointerBase

_log = logging.getLogger(__name__)

LAST, BEST = "last.pt", "best.pt"
_SHARDED = {LAST: "last", BEST: "best"}  # the links to sharded saves' folders
_TRAINING = "training.pt"  # in a sharded save's folder
STATE_KEYS = ("model", "optimizer", "scheduler", "scaler", "epoch", "rng", "progress")
_TRAINING_KEYS = STATE_KEYS[2:]  # training.pt's: all but the shards


class Checkpointer(CheckpointerBase):
    _saving: threading.Thread | None = None  # waits for a background save (--save-async), then finishes it
    _save_error: Exception | None = None
    _save_group = None  # the background saves' process group

    @property
    def _sharded(self) -> bool:
        return fsdp.is_sharded(self.model)

    @property
    def _saves_in_background(self) -> bool:
        return self._sharded

    def load_best(self) -> None:
        """The best epoch's model back (last's where no epoch was best): a fold's out-of-fold predictions."""
        self._read(str(newest(self.directory, BEST) or self.last_path))

    @property
    def last_path(self) -> Path:
        return self.directory / (_SHARDED[LAST] if self._sharded else LAST)

    def _write(self, training: dict, is_best: bool, kept: output_folder.Kept | None) -> None:
        if self._sharded:
            self._write_shards(training, is_best, kept)
            return
        checkpoint = {
            "model": distributed.unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.stepper.state_dict(),
            "scaler": self._scaler_state(),
            "ema": self.ema.averages if self.ema else {},
            **training,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        _atomic_save(checkpoint, self.last_path)
        if is_best:
            _atomic_copy(self.last_path, self.directory / BEST)
        if kept is not None:  # (top.json lists it once it is complete)
            _atomic_copy(self.last_path, self.directory / f"epoch-{kept.epoch}.pt")
            output_folder.record_top(self.directory, kept, f"epoch-{kept.epoch}.pt")

    def _write_shards(self, training: dict, is_best: bool, kept: output_folder.Kept | None) -> None:
        """Every rank its shards, into a new folder; rank 0 then training.pt and the switch of the links. In the
        background (--save-async): the shards are copied now, and written while training goes on."""
        self.wait_for_save()  # one save at a time
        folder = self.directory / distributed.share_from_main(output_folder.new_name(), "rank 0's name of the save")
        model, optimizer = get_state_dict(self.model, self.optimizer)
        shards = {"ema": self.ema.averages if self.ema else {}, "model": model, "optimizer": optimizer}
        rest = {"scheduler": self.schedule.stepper.state_dict(), "scaler": self._scaler_state(), **training}
        if not self.in_background:
            self._written(folder, rest, is_best, kept, lambda: dcp.save(shards, checkpoint_id=folder))
            return
        if self._save_group is None:  # its own group: training's collectives go on during the save
            self._save_group = dist.new_group(backend="gloo")
        writing = dcp.async_save(shards, checkpoint_id=folder, process_group=self._save_group)
        self._saving = threading.Thread(target=self._written_in_background, args=(folder, rest, is_best, kept, writing))
        self._saving.start()

    def _written_in_background(self, folder: Path, rest: dict, is_best: bool, kept, writing) -> None:
        started = time.perf_counter()
        try:
            self._written(folder, rest, is_best, kept, writing.result)
        except Exception as error:  # for wait_for_save() to raise, in the training's own thread
            self._save_error = error
            return
        if self.env.is_main:
            step = rest["progress"][0]["step"]
            where = f"epoch {rest['epoch'] + 1} step {step}" if step else f"epoch {rest['epoch']}"
            _log.info("background save of %s written (%.1f s)", where, time.perf_counter() - started)

    def _written(self, folder: Path, rest: dict, is_best: bool, kept, write) -> None:
        """`write()` the shards of every rank into `folder`; rank 0 then adds training.pt and points the links at
        it. A failed save leaves no folder, and the links as they were."""
        try:
            try:
                write()
            except CheckpointException as error:  # a BaseException: as an Exception, with the ranks' errors
                raise RuntimeError(f"the sharded save failed: {error}") from error
        except Exception:
            if self.env.is_main:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        if self.env.is_main:
            _atomic_save(rest, folder / _TRAINING)
            output_folder.publish(self.directory, folder, is_best, kept)

    def _wait_for_save(self) -> None:
        if self._saving is not None:
            self._saving.join()
            self._saving = None
        error, self._save_error = self._save_error, None
        if error is not None and self._out_of_space(error):
            raise UserError(self._no_space(), shown=self.env.local_rank == 0) from None
        if error is not None:
            raise error

    def _scaler_state(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def _init_weights(self, path: Path) -> None:
        model = distributed.unwrap(self.model)

        def fitting() -> dict:
            return self._fitting(model.state_dict(), read_weights(path)[0], path)

        # A sharded model: rank 0 alone reads the file (a folder too, whole) and sends each rank its shards of it,
        # as it sent the built network's (engine.whole_on_rank0_only()); an unsharded one: every rank reads it.
        weights = (
            distributed._on_rank0_only(fitting, self.env, "rank 0's reading of --init-from")
            if self._sharded
            else fitting()
        )
        options = StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=self._sharded)
        set_model_state_dict(model, weights, options=options)

    def _read(self, how: str) -> tuple[Path, dict] | None:
        """The checkpoint `how` names, loaded into the model, optimizer, scheduler and scaler; None: start afresh."""
        if how == "none":
            return None
        path = newest(self.directory, LAST) if how == "auto" else Path(how)
        # The same save on every rank before any load, some of which are collectives (a sharded model's, a
        # sharded save's): ranks that found different ones would wait for each other for ever.
        found = path.resolve().name if path is not None and path.exists() else None  # a sharded save's own name
        if len(set(distributed.all_gather_object(found))) > 1:
            raise UserError(
                f"ranks found different checkpoints in {self.directory}: give every machine the same --output-dir "
                "on a shared filesystem, or copy the checkpoints to each",
                shown=self.env.local_rank == 0,
            )
        if found is None:
            if how == "auto":
                return None
            raise UserError(f"checkpoint {path} not found: {output_folder.RESUME_CHOICES}")
        output_folder.check_checkpoint(path, _TRAINING, Path(LAST).suffix)  # a run's folder, the other framework's
        checkpoint = self._read_shards(path) if path.is_dir() else self._read_file(path)
        self.schedule.stepper.load_state_dict(checkpoint["scheduler"])
        # A run without loss scaling (CPU, --no-amp, bfloat16) saved {}: the scaler starts afresh then.
        if self.scaler is not None and checkpoint["scaler"]:
            self.scaler.load_state_dict(checkpoint["scaler"])
        return path, checkpoint

    def _read_file(self, path: Path) -> dict:
        checkpoint = _load_checkpoint(path)
        with _mismatch_explained(path):
            if self._sharded:  # each rank keeps its shards of the whole tensors
                optimizer = _keyed_by_name(checkpoint["optimizer"], self.optimizer, self.model)
                set_state_dict(self.model, self.optimizer, model_state_dict=checkpoint["model"],
                               optim_state_dict=optimizer, options=StateDictOptions(full_state_dict=True))  # fmt: skip
            else:
                distributed.unwrap(self.model).load_state_dict(checkpoint["model"])
                self.optimizer.load_state_dict(checkpoint["optimizer"])  # moves its state to the parameters' device
            if checkpoint.get("ema") and self.ema is not None:
                self.ema.load(checkpoint["ema"])
        return checkpoint

    def _read_shards(self, folder: Path) -> dict:
        """A sharded save, on this rank: its part of each tensor (the whole tensor for an unsharded model)."""
        checkpoint = _load_checkpoint(folder / _TRAINING, keys=_TRAINING_KEYS)
        model = self.model if self._sharded else distributed.unwrap(self.model)
        weights, optimizer = get_state_dict(model, self.optimizer)
        averaged = self.ema is not None and bool(_stored(folder, "ema"))
        if averaged:
            self.ema.start()  # (its tensors, which the load fills)
        with _mismatch_explained(folder):
            dcp.load({"ema": self.ema.averages if averaged else {}, "model": weights, "optimizer": optimizer},
                     checkpoint_id=folder)  # fmt: skip
            set_state_dict(model, self.optimizer, model_state_dict=weights, optim_state_dict=optimizer)
        return checkpoint

    def _reapply_schedule(self) -> None:
        """Set the rate the schedule gives where it stands: after a resume the optimizer holds the saved run's, which
        a larger --epochs, a warmup or a --lr given has changed."""
        stepper = self.schedule.stepper
        for group, base_lr in zip(self.optimizer.param_groups, stepper.base_lrs, strict=True):
            group["lr"] = base_lr * self.schedule.factor()
        stepper._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _base_lr(self) -> float:
        return self.schedule.stepper.base_lrs[0]

    def _set_base_lr(self, lr: float) -> None:
        """The first parameter group's base rate; the others' in proportion (a head at ten times the rate stays so)."""
        stepper = self.schedule.stepper
        first = stepper.base_lrs[0]
        stepper.base_lrs = [lr if base == first or not first else base * (lr / first) for base in stepper.base_lrs]
        for group, base in zip(self.optimizer.param_groups, stepper.base_lrs, strict=True):
            group["initial_lr"] = base

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


def _load_checkpoint(path: Path, keys: tuple[str, ...] = STATE_KEYS) -> dict:
    try:
        # weights_only: a checkpoint can hold tensors and plain data, never code. Onto the CPU: each piece goes
        # where it belongs from there (load_state_dict() moves weights and optimizer state to the model's device),
        # and a checkpoint written on GPUs loads on a machine without one.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise UserError(
            f"checkpoint {path} is corrupt or unreadable ({error.__class__.__name__}): continue from another one "
            f"with --resume {_other_save(path)}, or start in a new --output-dir"
        ) from None
    if not isinstance(state, dict) or not all(key in state for key in keys):
        raise UserError(
            f"{path} is not a checkpoint written by run.py (it needs {', '.join(keys)}): "
            "pass --resume with a last.pt or best.pt, or start in a new --output-dir"
        )
    return state


def _other_save(path: Path) -> Path:
    """The save to suggest when `path` cannot be read: best.pt beside a last.pt, the best link beside a save."""
    return path.parent.parent / _SHARDED[BEST] if path.name == _TRAINING else path.with_name(BEST)


@contextlib.contextmanager
def _mismatch_explained(path: Path):
    """A checkpoint of another model (names or shapes that differ): one line, not the loader's traceback."""
    try:
        yield
    except (RuntimeError, KeyError, ValueError, CheckpointException) as error:
        if isinstance(error, CheckpointException):  # each failed rank's (error, traceback): the first one's
            error = next(iter(error.failures.values()))[0]
        detail = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
        raise UserError(
            f"checkpoint {path} does not match the model ({detail}): a save of another model; resume one of this "
            "model's, or start this one in a new --output-dir"
        ) from None


def _keyed_by_name(state: dict, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict:
    """An optimizer.state_dict() (its parameters numbered in the optimizer's order) keyed by the parameters'
    names instead, as torch.distributed.checkpoint's state dicts are."""
    names = {id(parameter): name for name, parameter in distributed.unwrap(model).named_parameters()}
    order = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    return {
        "state": {order[number]: values for number, values in state["state"].items()},
        "param_groups": [
            {**group, "params": [order[number] for number in group["params"]]} for group in state["param_groups"]
        ],
    }


def newest(directory: Path, name: str) -> Path | None:
    """The newer complete save of `name` (LAST, BEST) in `directory`: the file, or the sharded folder; None."""
    return output_folder.newest(directory / name, directory / _SHARDED[name], _TRAINING)


def read_weights(checkpoint: Path, averaged: bool = True) -> tuple[dict, dict]:
    """The model weights and the data description (seam.data_description()) of a checkpoint (a file, or a sharded
    save's folder, read whole), or of a bare state dict. The weights are the averaged ones of --ema where the
    checkpoint holds them, unless not `averaged` (--weights raw)."""
    output_folder.check_checkpoint(checkpoint, _TRAINING, Path(LAST).suffix)
    if checkpoint.is_dir():
        data = _load_checkpoint(checkpoint / _TRAINING, keys=_TRAINING_KEYS)["data"]
        return _chosen(*_sharded_weights(checkpoint, averaged), averaged), data
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)  # the caller moves what it keeps
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise UserError(f"checkpoint {checkpoint} is corrupt or unreadable ({error.__class__.__name__})") from None
    weights = state.get("model", state) if isinstance(state, dict) else None
    if not isinstance(weights, dict) or not weights:
        raise UserError(f"{checkpoint} holds no model weights: pass a last.pt or best.pt that run.py wrote")
    averages = state.get("ema") if "model" in state else None
    return _chosen(weights, averages, averaged), state.get("data") or {}


def _chosen(weights: dict, averages: dict | None, averaged: bool) -> dict:
    """The model's state dict with the averages in place of its weights (in their dtypes), or as it is."""
    if not (averaged and averages):
        return weights
    return weights | {name: average.to(weights[name].dtype) for name, average in averages.items()}


def export_weights(checkpoint: Path, output: Path, averaged: bool = True) -> Path:
    """export.py: the model weights of `checkpoint` (its averages under --ema, unless not `averaged`) as one file,
    {"model": state dict, "data": its description} (predict.py takes it too); returns the file written."""
    weights, data = read_weights(checkpoint, averaged)
    output.parent.mkdir(parents=True, exist_ok=True)
    _atomic_save({"model": weights, "data": data}, output)
    return output


def _sharded_weights(folder: Path, averaged: bool) -> tuple[dict, dict]:
    """The whole model of a sharded save, and its averages (--ema; if `averaged`), in this process alone (no
    collective): tensors of the sizes its metadata records, filled from every rank's shards."""
    wanted = {"ema": _stored(folder, "ema") if averaged else {}, "model": _stored(folder, "model")}
    with warnings.catch_warnings():  # that it reads in this process alone: as asked
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(wanted, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    return wanted["model"], wanted["ema"]


def _stored(folder: Path, key: str) -> dict:
    """Empty tensors of the sizes a sharded save's metadata records under `key` ("model", "ema"), by name."""
    try:
        stored = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    except (OSError, pickle.UnpicklingError) as error:
        raise UserError(f"checkpoint {folder} is corrupt or unreadable ({error.__class__.__name__})") from None
    return {
        name.removeprefix(f"{key}."): torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for name, meta in stored.items()
        if name.startswith(f"{key}.")
    }


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
