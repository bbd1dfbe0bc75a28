"""Predictions from a trained checkpoint, in one process: what the notebook shows, and predict.py builds on.

`model = load_for_inference(checkpoint_path("output", "best"))`, then `labels = predict(model, images)`:
images are float32 (N, C, H, W), as images.load_image() makes them.
"""

import pickle
from pathlib import Path

import numpy as np
import paddle

from .checkpoint import BEST, LAST
from .errors import UserError
from .images import model_options
from .model import build_model


def checkpoint_path(output_dir: str | Path, which: str = "best") -> Path:
    """The best (highest validation accuracy) or last checkpoint a run wrote into `output_dir`."""
    return Path(output_dir) / "checkpoints" / {"best": BEST, "last": LAST}[which]


def pick_device(device: str = "auto") -> str:
    """--device's choices: auto (a GPU where there is one), cpu, gpu; as paddle names devices."""
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise UserError(
            "--device gpu was asked for, but paddle sees no GPU (is paddlepaddle-gpu installed?): use --device cpu or auto"
        )
    return "gpu:0" if device != "cpu" and has_gpu else "cpu"


def checkpoint_data(checkpoint: str | Path) -> dict:
    """What a checkpoint of run.py records about its training images (images.data_description()):
    class names, image size, channels, mean and std; {} for a bare state dict."""
    return _load(Path(checkpoint))[1]


def load_for_inference(checkpoint: str | Path, device: str = "auto", num_classes: int | None = None) -> paddle.nn.Layer:
    """build_model() with the checkpoint's weights, in eval mode, on the device.

    num_classes: the network's outputs; by default the size of the last tensor of the saved weights
    (the classifier's bias in most networks). build_model() gets the channels the checkpoint records,
    if it takes them. A last.pdparams or best.pdparams run.py wrote.
    """
    checkpoint = Path(checkpoint)
    weights, data = _load(checkpoint)
    model = build_model(num_classes or int(list(weights.values())[-1].shape[0]), **model_options(build_model, data))
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
    return model


def _load(checkpoint: Path) -> tuple[dict, dict]:
    """The model weights of a .pdparams file, and the data description of the .pdopt beside it (if any)."""
    if not checkpoint.is_file():
        raise UserError(
            f"checkpoint {checkpoint} not found: pass a last.pdparams or best.pdparams from OUTPUT_DIR/checkpoints/"
        )
    try:
        weights = paddle.load(str(checkpoint))
        state_path = checkpoint.with_suffix(".pdopt")
        state = paddle.load(str(state_path)) if state_path.is_file() else {}
    except (ValueError, EOFError, OSError, pickle.UnpicklingError) as error:
        raise UserError(f"checkpoint {checkpoint} is corrupt or unreadable ({error.__class__.__name__})") from None
    if not isinstance(weights, dict) or not weights:
        raise UserError(f"{checkpoint} holds no model weights: pass a last.pdparams or best.pdparams that run.py wrote")
    return weights, (state.get("data") if isinstance(state, dict) else None) or {}


@paddle.no_grad()
def predict(model: paddle.nn.Layer, images, batch_size: int = 256) -> np.ndarray:
    """The predicted class index of each image (an int64 array): float32 (N, C, H, W), numpy or tensors."""
    place = next(iter(model.parameters())).place
    labels = []
    for start in range(0, len(images), batch_size):
        batch = paddle.to_tensor(np.asarray(images[start : start + batch_size], dtype=np.float32), place=place)
        labels.append(model(batch).argmax(axis=1).numpy().astype(np.int64))
    return np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
