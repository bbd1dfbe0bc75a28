"""Checkpoints: written by global rank 0 only, as a consistent set of files; read back on every rank.

DIR/checkpoints/last.pdparams is the model's state dict (paddle.load() it into
any copy of the model); last.pdopt beside it holds everything else needed to
continue: optimizer (with the learning-rate schedule inside), AMP scaler,
epochs done, the best value of task.py's BEST_METRIC, every rank's RNG states and,
after a SIGTERM stop, how far each rank is into the next epoch; last.json what
predicting needs (the data's description: how inputs were read), for predict.py.
best.* is a copy of the epoch with the best value.

Several files cannot be replaced in one atomic step, so a save goes through a
folder, and a folder rename is atomic:
1. write the new files (and best.* when this epoch is the best) into .saving/;
2. rename .saving/ to .saved/: the commit point;
3. move each file of .saved/ over its old version, then remove .saved/.
A crash in 1 leaves .saving/, which the next start deletes: the old files stay.
A crash in 3 leaves .saved/, which the next start moves into place first: the
new files win. resume() does that recovery before it reads anything, so a run
never loads weights from one epoch with the optimizer state of another. What is
the same in PyTorch (the training state, the best epoch, resuming on every rank)
is state.CheckpointerBase.

Under --strategy sharding each rank holds a part of the optimizer state, and saves no single file: each rank
writes its part into a new folder, rank 0 adds the weights and training.pdopt (the rest, written last: a folder
without it is incomplete), then points the link DIR/checkpoints/last (and best) at the folder (output_folder.py).
Paddle cannot load sharded state with several processes on CPUs, so a resume reads the parts whole, on every
rank, and each rank's optimizer keeps its own part: either form resumes under either strategy, on any number
of processes.
"""

import errno
import json
import logging
import os
import pickle
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import paddle

from . import distributed, output_folder, sharding
from .errors import UserError
from .state import CheckpointerBase

_log = logging.getLogger(__name__)  # for the interrupted-save warning, which PyTorch has no need of

LAST, BEST = "last.pdparams", "best.pdparams"
STATE_KEYS = ("optimizer", "scaler", "epoch", "rng", "progress")
_STATE = ".pdopt"  # the training state beside each .pdparams
_DATA = ".json"  # and the data description: predict.py reads it without the optimizer's state
_SAVING, _SAVED = ".saving", ".saved"
_FOLDERS = {LAST: "last", BEST: "best"}  # the links to sharded saves' folders
_WEIGHTS, _TRAINING = "model.pdparams", "training.pdopt"  # in a sharded save's folder, beside optimizer-<rank>
_EMA, _EMA_WEIGHTS = ".pdema", "ema.pdparams"  # --ema's averaged weights: beside each .pdparams, in a sharded save


class Checkpointer(CheckpointerBase):
    """(The schedule's LambdaDecay is attached to the optimizer, engine.cosine_schedule(), whose state holds it.)"""

    @property
    def _sharded(self) -> bool:
        return sharding.holds_part(self.optimizer)

    def load_best(self) -> None:
        """The best epoch's model back (last's where no epoch was best): a fold's out-of-fold predictions."""
        self._read(str(newest(self.directory, BEST) or self.last_path))

    @property
    def last_path(self) -> Path:
        return self.directory / (_FOLDERS[LAST] if self._sharded else LAST)

    def _write(self, training: dict, is_best: bool, kept: output_folder.Kept | None) -> None:
        if self._sharded:
            self._write_parts(training, is_best, kept)
            return
        training = {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            **training,
        }
        staging = self.directory / _SAVING
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            _save_synced(distributed.unwrap(self.model).state_dict(), staging / LAST)
            _save_synced(training, (staging / LAST).with_suffix(_STATE))
            (staging / LAST).with_suffix(_DATA).write_text(json.dumps(self.data), encoding="utf-8")
            _sync((staging / LAST).with_suffix(_DATA))
            # (Without --ema, none; or an empty one, where an earlier run's averages would stay beside new weights.)
            averages = self.ema.averages if self.ema else {}
            if averages or (self.directory / LAST).with_suffix(_EMA).exists():
                with warnings.catch_warnings():  # paddle's that an empty one needs no saving: it does here
                    warnings.simplefilter("ignore", UserWarning)
                    _save_synced(averages, (staging / LAST).with_suffix(_EMA))
            for copy in (["best"] if is_best else []) + ([f"epoch-{kept.epoch}"] if kept else []):
                for written in sorted(staging.glob("last.*")):
                    shutil.copyfile(written, staging / written.name.replace("last", copy))
            staging.rename(self.directory / _SAVED)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # a failed save (disk full, ...) leaves nothing behind
        _move_saved_into_place(self.directory)
        if kept is not None:  # (top.json lists it once it is complete)
            output_folder.record_top(self.directory, kept, f"epoch-{kept.epoch}{Path(LAST).suffix}")

    def _write_parts(self, training: dict, is_best: bool, kept: output_folder.Kept | None) -> None:
        """Every rank its part of the optimizer state, rank 0 the weights, into a new folder; once all are
        written, rank 0 adds training.pdopt and switches the links. A failed save leaves no folder."""
        folder = self.directory / distributed.share_from_main(output_folder.new_name(), "rank 0's name of the save")
        sharding.gather_parameters(self.model)
        error = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _save_synced(self.optimizer.state_dict(), folder / f"optimizer-{self.env.rank}.pdopt")
            if self.env.is_main:
                _save_synced(distributed.unwrap(self.model).state_dict(), folder / _WEIGHTS)
                if self.ema and self.ema.averages:
                    _save_synced(self.ema.averages, folder / _EMA_WEIGHTS)
        except Exception as caught:
            error = caught
        failures = distributed.all_gather_object(error and ("space" if self._out_of_space(error) else repr(error)))
        if any(failures):
            if self.env.is_main:
                shutil.rmtree(folder, ignore_errors=True)
            if "space" in failures:  # on every rank: a full disk is one line, whichever rank met it
                raise OSError(errno.ENOSPC, f"no space left for a part of the save in {folder}") from error
            raise error or RuntimeError(f"a rank could not write its part of the save: {next(filter(None, failures))}")
        if self.env.is_main:
            scaler = self.scaler.state_dict() if self.scaler is not None else None
            _save_synced({"scaler": scaler, **training}, folder / _TRAINING)
            output_folder.publish(self.directory, folder, is_best, kept)

    def _init_weights(self, path: Path) -> None:
        model = distributed.unwrap(self.model)
        fitting = self._fitting(model.state_dict(), read_weights(path)[0], path)  # (says which are left as made)
        with warnings.catch_warnings():  # paddle's "Skip loading for ...": those, said otherwise
            warnings.filterwarnings("ignore", "Skip loading for", UserWarning)
            model.set_state_dict(fitting)

    def _read(self, how: str) -> tuple[Path, dict] | None:
        """The checkpoint `how` names, loaded into the model, optimizer and scaler; None: start afresh.

        First, rank 0 completes or drops a save that a crash interrupted.
        """
        if self.env.is_main:
            _finish_interrupted_save(self.directory)
        distributed.barrier()
        if how == "none":
            return None
        path = newest(self.directory, LAST) if how == "auto" else Path(how)
        if path is None:
            return None
        named = path if path.suffix or path.exists() else path.with_suffix(Path(LAST).suffix)  # (--resume DIR/last)
        # a run's folder, the other framework's
        output_folder.check_checkpoint(named, _TRAINING, Path(LAST).suffix, output_folder.RESUME_CHOICES)
        if path.is_dir():
            weights_path, (weights, state) = path, _read_parts(path)
        else:
            weights_path, (weights, state) = path.with_suffix(".pdparams"), _read_file(path)
        if not isinstance(weights, dict) or not isinstance(state, dict) or not all(key in state for key in STATE_KEYS):
            raise UserError(
                f"{weights_path} is not a checkpoint written by run.py (it needs {', '.join(STATE_KEYS)}): "
                f"pass --resume with a {LAST} or {BEST}, or start in a new --output-dir"
            )
        model = distributed.unwrap(self.model)
        problem = _mismatch(model.state_dict(), weights)
        if problem:
            raise UserError(
                f"checkpoint {weights_path} does not match the model ({problem}): a save of another model; resume one "
                "of this model's, or start this one in a new --output-dir"
            )
        model.set_state_dict(weights)
        self.optimizer.set_state_dict(state["optimizer"])  # a sharded optimizer keeps its own part
        if state["ema"] and self.ema is not None:
            self.ema.load(state["ema"])
        # A run without loss scaling (CPU, --no-amp) saved {}: the scaler starts afresh then.
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        return weights_path, state

    def _reapply_schedule(self) -> None:
        """Set the rate the schedule gives where it stands: after a resume the scheduler holds the saved run's
        last_lr, which a larger --epochs, a warmup or a --lr given has changed; the optimizer takes last_lr at every
        step."""
        self.schedule.stepper.last_lr = self.schedule.stepper.get_lr()

    def _base_lr(self) -> float:
        return self.schedule.stepper.base_lr

    def _set_base_lr(self, lr: float) -> None:
        self.schedule.stepper.base_lr = lr  # (paddle's schedule state, in the optimizer's, holds no base rate)

    def _capture_rng(self) -> dict:
        """This rank's random streams: of this rank's own GPU only (a CPU run never touches CUDA), so the
        checkpoint resumes on a machine that sees another number of GPUs, or none."""
        name, keys, *rest = np.random.get_state()
        return {
            "python": random.getstate(),
            "numpy": (name, keys.tolist(), *rest),  # a list: paddle.save would turn the uint32 array into a tensor
            "paddle": paddle.get_rng_state("cpu"),
            "gpu": paddle.get_rng_state("gpu")[self._gpu_index()] if self.env.on_gpu else None,
        }

    def _restore_rng(self, state: dict) -> None:
        random.setstate(state["python"])
        name, keys, *rest = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
        paddle.set_rng_state(state["paddle"], "cpu")
        # A GPU stream saved on the CPU, or none saved on a GPU: that stream goes on from its seed.
        if state["gpu"] is not None and self.env.on_gpu:
            # paddle sets the streams of all visible GPUs at once: this rank changes its own only.
            streams = paddle.get_rng_state("gpu")
            streams[self._gpu_index()] = state["gpu"]
            paddle.set_rng_state(streams, "gpu")

    def _gpu_index(self) -> int:
        return int(self.env.device.split(":")[1])  # "gpu:N", as setup() names this rank's GPU


def _read_file(path: Path) -> tuple[dict, dict]:
    """The weights and training state of a checkpoint in files (the .pdparams and the .pdopt beside it)."""
    weights_path, state_path = path.with_suffix(".pdparams"), path.with_suffix(_STATE)
    if not weights_path.exists():
        raise UserError(f"checkpoint {weights_path} not found: {output_folder.RESUME_CHOICES}")
    if not state_path.exists():
        raise UserError(
            f"{weights_path} is not a checkpoint written by run.py (it has no {state_path.name} beside it): "
            f"pass --resume with a {LAST} or {BEST}, or start in a new --output-dir "
            "(to start from these weights, set_state_dict() them in build_model())"
        )
    return _load_file(weights_path), {**_load_file(state_path), "ema": _averages_of(weights_path)}


def _read_parts(folder: Path) -> tuple[dict, dict]:
    """The weights and training state of a sharded save, the optimizer's parts of every rank merged."""
    training = _load_file(folder / _TRAINING)
    optimizer = {}
    for part in sorted(folder.glob("optimizer-*.pdopt")):
        optimizer.update(_load_file(part))
    return _load_file(folder / _WEIGHTS), {**training, "optimizer": optimizer, "ema": _averages_of(folder)}


def _averages_of(checkpoint: Path) -> dict:
    """--ema's averaged weights beside a .pdparams, or in a sharded save's folder ({} where there are none)."""
    path = checkpoint / _EMA_WEIGHTS if checkpoint.is_dir() else checkpoint.with_suffix(_EMA)
    return _load_file(path) if path.is_file() else {}


def read_weights(checkpoint: Path, averaged: bool = True) -> tuple[dict, dict]:
    """The model weights of a .pdparams file, and the data description (seam.data_description()) in the .json
    beside it, if there is one; or both of a sharded save's folder. The weights are the averaged ones of --ema
    where the checkpoint holds them, unless not `averaged` (--weights raw)."""
    output_folder.check_checkpoint(checkpoint, _TRAINING, Path(LAST).suffix)
    if checkpoint.is_dir():
        weights = _chosen(_load_file(checkpoint / _WEIGHTS), _averages_of(checkpoint) if averaged else {})
        return weights, _load_file(checkpoint / _TRAINING)["data"]
    description = checkpoint.with_suffix(_DATA)
    try:
        weights = paddle.load(str(checkpoint))
        data = json.loads(description.read_text(encoding="utf-8")) if description.is_file() else {}
    except (ValueError, EOFError, OSError, pickle.UnpicklingError) as error:
        raise UserError(f"checkpoint {checkpoint} is corrupt or unreadable ({error.__class__.__name__})") from None
    if not isinstance(weights, dict) or not weights:
        raise UserError(f"{checkpoint} holds no model weights: pass a last.pdparams or best.pdparams that run.py wrote")
    return _chosen(weights, _averages_of(checkpoint) if averaged else {}), data if isinstance(data, dict) else {}


def _chosen(weights: dict, averages: dict) -> dict:
    """The model's state dict with the averages in place of its weights (in their dtypes)."""
    return weights | {name: average.astype(weights[name].dtype) for name, average in averages.items()}


def newest(directory: Path, name: str) -> Path | None:
    """The newer complete save of `name` (LAST, BEST) in `directory`: the file, or the sharded folder; None."""
    return output_folder.newest(directory / name, directory / _FOLDERS[name], _TRAINING)


def export_weights(checkpoint: Path, output: Path, averaged: bool = True) -> Path:
    """export.py: the model weights of `checkpoint` (its averages under --ema, unless not `averaged`) as one
    .pdparams (its data description in the .json beside it, so predict.py takes it too); returns the file written."""
    weights, data = read_weights(checkpoint, averaged)
    output.parent.mkdir(parents=True, exist_ok=True)
    paddle.save(weights, str(output))
    output.with_suffix(_DATA).write_text(json.dumps(data), encoding="utf-8")
    return output


def _save_synced(obj, path: Path) -> None:
    paddle.save(obj, str(path))
    _sync(path)


def _sync(path: Path) -> None:
    """Wait until the file's bytes are on disk: the rename that follows must not outrun them."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _move_saved_into_place(directory: Path) -> None:
    saved = directory / _SAVED
    for path in sorted(saved.iterdir()):
        os.replace(path, directory / path.name)
    saved.rmdir()


def _finish_interrupted_save(directory: Path) -> None:
    """Complete a committed save, or drop an uncommitted one, that a crash interrupted."""
    if (directory / _SAVED).is_dir():
        _log.warning("completing the checkpoint save that was interrupted in %s", directory)
        _move_saved_into_place(directory)
    shutil.rmtree(directory / _SAVING, ignore_errors=True)


def _load_file(path: Path):
    try:
        return paddle.load(str(path))
    except (ValueError, EOFError, OSError, pickle.UnpicklingError) as error:
        raise UserError(
            f"checkpoint {path} is corrupt or unreadable ({error.__class__.__name__}): continue from another one "
            f"with --resume {path.with_name(BEST)}, or start in a new --output-dir"
        ) from None


def _mismatch(expected: dict, saved: dict) -> str | None:
    """The first difference between the model's state dict and a saved one, in words; None if they fit."""
    for key, value in expected.items():
        if key not in saved:
            return f"{key} is missing from the checkpoint"
        saved_shape, model_shape = list(saved[key].shape), list(value.shape)
        if saved_shape != model_shape:
            return f"size mismatch for {key}: {saved_shape} in the checkpoint, {model_shape} in the model"
    extra = sorted(saved.keys() - expected.keys())
    return f"{extra[0]} is not in the model" if extra else None
