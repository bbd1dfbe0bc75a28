"""Predictions from a trained checkpoint, in one process: what the notebook shows, and predict.py builds on.

`model = load_for_inference(checkpoint_path("output", "best"))`, then `rows = predict(model, batch)`: a
batch as data.build_predict_set()'s loader makes them (numpy arrays or tensors), one row per input, as
task.predict_step() makes it (classification: the class index and its probability). Both take the project's
seam.Task(), or one given (a notebook's own).
"""

from pathlib import Path

import numpy as np
import torch

from . import loaders
from .batches import sample_count
from .checkpoint import BEST, LAST, newest, read_weights
from .errors import UserError
from .seam import Task


def checkpoint_path(output_dir: str | Path, which: str = "best") -> Path:
    """The best (by task.py's BEST_METRIC) or last checkpoint a run wrote into `output_dir`: the file, or the
    sharded save's folder (--strategy fsdp), whichever is newer; the file's path where there is neither."""
    directory, name = Path(output_dir) / "checkpoints", {"best": BEST, "last": LAST}[which]
    return newest(directory, name) or directory / name


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """--device's choices: auto (a GPU where there is one), cpu, gpu; or a rank's own device (DistEnv.device)."""
    if isinstance(device, torch.device):
        return device
    if device == "gpu" and not torch.cuda.is_available():
        raise UserError("--device gpu was asked for, but no CUDA GPU is visible: use --device cpu or auto")
    return torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")


def checkpoint_data(checkpoint: str | Path) -> dict:
    """What a checkpoint of run.py records for predicting (seam.data_description()): class names, and what the
    task's data needs to read inputs as training did (data.py's description); {} for a bare state dict."""
    return read_weights(Path(checkpoint))[1]


def load_for_inference(
    checkpoint: str | Path,
    device: str | torch.device = "auto",
    num_classes: int | None = None,
    task: Task | None = None,
    averaged: bool = True,
) -> torch.nn.Module:
    """build_model() with the checkpoint's weights, in eval mode, on the device.

    num_classes: the network's outputs; by default the checkpoint's, or for a bare state dict the size of the
    last tensor of its weights (the last layer's bias in most networks). build_model() gets what the checkpoint
    records that it names as parameters. A last.pt or best.pt run.py
    wrote (or the folder of a sharded save), or a bare state dict. The weights are the averaged ones of a run of
    --ema, unless not `averaged` (predict.py's --weights raw).
    """
    return load_with_data(checkpoint, device, num_classes, task, averaged)[0]


def load_with_data(
    checkpoint, device="auto", num_classes=None, task=None, averaged=True
) -> tuple[torch.nn.Module, dict]:
    """load_for_inference()'s model (its arguments) and checkpoint_data()'s description from one read of the
    checkpoint (predict.py's: a large checkpoint is read once)."""
    target = pick_device(device)
    weights, data = read_weights(Path(checkpoint), averaged)
    model = (task or Task()).network(data, num_classes, weights)
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        detail = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
        raise UserError(f"checkpoint {checkpoint} does not match build_model() ({detail})") from None
    return model.to(target).eval(), data


@torch.no_grad()
def predict(model: torch.nn.Module, batch, task: Task | None = None) -> list:
    """task.predict_step() on a batch of inputs, moved to the model's device: one row per input."""
    sample_count(batch)  # (an error of the data's code, raised in the loader, stops here)
    batch = loaders.to_device(batch, next(model.parameters()).device)
    return (task or Task()).predict_rows(model, batch)


@torch.no_grad()
def averaged_outputs(model: torch.nn.Module, batch, task: Task, tta: bool = False) -> np.ndarray:
    """task.predict_outputs() on a batch of inputs (with --tta: the mean over its test-time views), on the model's
    device: what predict.py's ensembles average."""
    sample_count(batch)
    return task.averaged_outputs(model, loaders.to_device(batch, next(model.parameters()).device), tta)
