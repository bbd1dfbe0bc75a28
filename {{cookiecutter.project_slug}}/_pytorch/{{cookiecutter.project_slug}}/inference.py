"""Predictions from a trained checkpoint, in one process: what the notebook shows, and predict.py builds on.

`model = load_for_inference(checkpoint_path("output", "best"))`, then `labels = predict(model, images)`:
images are float32 (N, C, H, W), as images.load_image() makes them.
"""

from pathlib import Path

import numpy as np
import torch

from .checkpoint import BEST, LAST, read_weights
from .errors import UserError
from .images import model_options
from .model import build_model


def checkpoint_path(output_dir: str | Path, which: str = "best") -> Path:
    """The best (highest validation accuracy) or last checkpoint a run wrote into `output_dir`."""
    return Path(output_dir) / "checkpoints" / {"best": BEST, "last": LAST}[which]


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """--device's choices: auto (a GPU where there is one), cpu, gpu; or a rank's own device (DistEnv.device)."""
    if isinstance(device, torch.device):
        return device
    if device == "gpu" and not torch.cuda.is_available():
        raise UserError("--device gpu was asked for, but no CUDA GPU is visible: use --device cpu or auto")
    return torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")


def checkpoint_data(checkpoint: str | Path) -> dict:
    """What a checkpoint of run.py records about its training images (images.data_description()):
    class names, image size, channels, mean and std; {} for a bare state dict."""
    return read_weights(Path(checkpoint))[1]


def load_for_inference(
    checkpoint: str | Path, device: str | torch.device = "auto", num_classes: int | None = None
) -> torch.nn.Module:
    """build_model() with the checkpoint's weights, in eval mode, on the device.

    num_classes: the network's outputs; by default the size of the last tensor of the saved weights
    (the classifier's bias in most networks). build_model() gets the channels the checkpoint records,
    if it takes them. A last.pt or best.pt run.py wrote, or a bare state dict.
    """
    return load_with_data(checkpoint, device, num_classes)[0]


def load_with_data(
    checkpoint: str | Path, device: str | torch.device = "auto", num_classes: int | None = None
) -> tuple[torch.nn.Module, dict]:
    """load_for_inference()'s model and checkpoint_data()'s description from one read of the checkpoint
    (predict.py's: a large checkpoint is read once)."""
    checkpoint = Path(checkpoint)
    target = pick_device(device)
    weights, data = read_weights(checkpoint)
    model = build_model(num_classes or len(list(weights.values())[-1]), **model_options(build_model, data))
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        detail = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
        raise UserError(f"checkpoint {checkpoint} does not match build_model() ({detail})") from None
    return model.to(target).eval(), data


@torch.no_grad()
def probabilities(model: torch.nn.Module, images, batch_size: int = 256) -> np.ndarray:
    """Each image's class probabilities, the softmax of the model's outputs: float32 (N, classes)."""
    device = next(model.parameters()).device
    batches = []
    for start in range(0, len(images), batch_size):
        batch = torch.as_tensor(np.asarray(images[start : start + batch_size], dtype=np.float32), device=device)
        batches.append(model(batch).float().softmax(dim=1).cpu().numpy())
    return np.concatenate(batches) if batches else np.zeros((0, 0), dtype=np.float32)


def predict(model: torch.nn.Module, images, batch_size: int = 256) -> np.ndarray:
    """The predicted class index of each image (an int64 array): float32 (N, C, H, W), numpy or tensors."""
    if not len(images):
        return np.zeros(0, dtype=np.int64)
    return probabilities(model, images, batch_size).argmax(axis=1).astype(np.int64)
