"""Predictions from a trained checkpoint, in one process: what the notebook shows, and predict.py builds on.

`model = load_for_inference(checkpoint_path("output", "best"))`, then `labels = predict(model, images)`:
images are float32 (N, C, H, W), as images.load_image() makes them.
"""

from pathlib import Path

import numpy as np
import paddle

from .checkpoint import BEST, LAST, read_weights
from .errors import UserError
from .images import model_options
from .model import build_model


def checkpoint_path(output_dir: str | Path, which: str = "best") -> Path:
    """The best (highest validation accuracy) or last checkpoint a run wrote into `output_dir`."""
    return Path(output_dir) / "checkpoints" / {"best": BEST, "last": LAST}[which]


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
    """What a checkpoint of run.py records about its training images (images.data_description()):
    class names, image size, channels, mean and std; {} for a bare state dict."""
    return read_weights(Path(checkpoint))[1]


def load_for_inference(checkpoint: str | Path, device: str = "auto", num_classes: int | None = None) -> paddle.nn.Layer:
    """build_model() with the checkpoint's weights, in eval mode, on the device.

    num_classes: the network's outputs; by default the size of the last tensor of the saved weights
    (the classifier's bias in most networks). build_model() gets the channels the checkpoint records,
    if it takes them. A last.pdparams or best.pdparams run.py wrote.
    """
    return load_with_data(checkpoint, device, num_classes)[0]


def load_with_data(
    checkpoint: str | Path, device: str = "auto", num_classes: int | None = None
) -> tuple[paddle.nn.Layer, dict]:
    """load_for_inference()'s model and checkpoint_data()'s description from one read of the checkpoint
    (predict.py's: a large checkpoint is read once)."""
    checkpoint = Path(checkpoint)
    weights, data = read_weights(checkpoint)
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
    return model, data


@paddle.no_grad()
def probabilities(model: paddle.nn.Layer, images, batch_size: int = 256) -> np.ndarray:
    """Each image's class probabilities, the softmax of the model's outputs: float32 (N, classes)."""
    place = next(iter(model.parameters())).place
    batches = []
    for start in range(0, len(images), batch_size):
        batch = paddle.to_tensor(np.asarray(images[start : start + batch_size], dtype=np.float32), place=place)
        batches.append(paddle.nn.functional.softmax(model(batch).astype("float32"), axis=1).numpy())
    return np.concatenate(batches) if batches else np.zeros((0, 0), dtype=np.float32)


def predict(model: paddle.nn.Layer, images, batch_size: int = 256) -> np.ndarray:
    """The predicted class index of each image (an int64 array): float32 (N, C, H, W), numpy or tensors."""
    if not len(images):
        return np.zeros(0, dtype=np.int64)
    return probabilities(model, images, batch_size).argmax(axis=1).astype(np.int64)
