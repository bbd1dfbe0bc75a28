"""Predictions from a trained checkpoint, in one process: what the notebook shows, and predict.py builds on.

`model = load_for_inference(checkpoint_path("output", "best"))`, then `rows = predict(model, batch)`: a
batch as data.build_predict_set()'s loader makes them (numpy arrays or tensors), one row per input, as
task.predict_step() makes it (classification: the class index and its probability). Both take the project's
seam.Task(), or one given (a notebook's own).
"""

from pathlib import Path

import numpy as np
import paddle

from . import loaders
from .batches import sample_count
from .checkpoint import BEST, LAST, newest, read_weights
from .errors import UserError
from .seam import Task


def checkpoint_path(output_dir: str | Path, which: str = "best") -> Path:
    """The best (by task.py's BEST_METRIC) or last checkpoint a run wrote into `output_dir` (its path where there
    is none)."""
    directory, name = Path(output_dir) / "checkpoints", {"best": BEST, "last": LAST}[which]
    return newest(directory, name) or directory / name


def pick_device(device: str = "auto") -> str:
    """--device's choices: auto (a GPU where there is one), cpu, gpu; or a rank's own device (DistEnv.device, "gpu:N").
    As paddle names devices."""
    if device.startswith("gpu:"):
        return device
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise UserError(
            "--device gpu was asked for, but paddle sees no GPU (is paddlepaddle-gpu installed?): use --device cpu or auto"
        )
    return "gpu:0" if device != "cpu" and has_gpu else "cpu"


def checkpoint_data(checkpoint: str | Path) -> dict:
    """What a checkpoint of run.py records for predicting (seam.data_description()): class names, and what the
    task's data needs to read inputs as training did (data.py's description); {} for a bare state dict."""
    return read_weights(Path(checkpoint))[1]


def load_for_inference(
    checkpoint: str | Path,
    device: str = "auto",
    num_classes: int | None = None,
    task: Task | None = None,
    averaged: bool = True,
) -> paddle.nn.Layer:
    """build_model() with the checkpoint's weights, in eval mode, on the device.

    num_classes: the network's outputs; by default the checkpoint's, or for bare weights the size of the last
    tensor saved (the last layer's bias in most networks). build_model() gets what the checkpoint records that
    it names as parameters. A last.pdparams or best.pdparams run.py wrote. The weights are the averaged ones of a
    run of --ema, unless not `averaged` (predict.py's --weights raw).
    """
    return load_with_data(checkpoint, device, num_classes, task, averaged)[0]


def load_with_data(
    checkpoint, device="auto", num_classes=None, task=None, averaged=True
) -> tuple[paddle.nn.Layer, dict]:
    """load_for_inference()'s model (its arguments) and checkpoint_data()'s description from one read of the
    checkpoint (predict.py's: a large checkpoint is read once)."""
    weights, data = read_weights(Path(checkpoint), averaged)
    model = (task or Task()).network(data, num_classes, weights)
    expected = model.state_dict()
    for key, value in expected.items():
        if key not in weights or list(weights[key].shape) != list(value.shape):
            found = list(weights[key].shape) if key in weights else "nothing"
            raise UserError(
                f"checkpoint {checkpoint} does not match build_model() ({key}: {found} saved, {list(value.shape)} in the model)"
            )
    model.set_state_dict(weights)
    model.to(device=pick_device(device))
    model.eval()
    return model, data


@paddle.no_grad()
def predict(model: paddle.nn.Layer, batch, task: Task | None = None) -> list:
    """task.predict_step() on a batch of inputs, moved to the model's device: one row per input."""
    sample_count(batch)  # (an error of the data's code, raised in the loader, stops here)
    return (task or Task()).predict_rows(model, _on_device_of(model, batch))


@paddle.no_grad()
def averaged_outputs(model: paddle.nn.Layer, batch, task: Task, tta: bool = False) -> np.ndarray:
    """task.predict_outputs() on a batch of inputs (with --tta: the mean over its test-time views), on the model's
    device: what predict.py's ensembles average."""
    sample_count(batch)
    return task.averaged_outputs(model, _on_device_of(model, batch), tta)


def _on_device_of(model: paddle.nn.Layer, batch):
    place = next(iter(model.parameters())).place
    return loaders.to_device(batch, "cpu" if place.is_cpu_place() else f"gpu:{place.gpu_device_id()}")
