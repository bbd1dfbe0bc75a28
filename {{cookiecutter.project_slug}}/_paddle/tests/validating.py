"""test_evaluate.py's Paddle side: the validation step of its small classification task, its data as tensors, the
loss it expects, and the layers it builds its models of (both frameworks' nn name them alike)."""

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn  # noqa: F401 - test_evaluate.py's layers
from paddle.io import TensorDataset


def validation_step(model, batch) -> tuple[dict, dict]:
    inputs, labels = batch
    logits = model(inputs).astype("float32")
    correct = (logits.argmax(axis=1) == labels.flatten()).astype("int64").sum()
    return {"loss": F.cross_entropy(logits, labels, reduction="sum"), "correct": correct}, {"labels": labels}


def dataset(inputs: np.ndarray, labels: np.ndarray) -> TensorDataset:
    return TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(labels)])


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """The mean cross-entropy of these logits and labels, as Paddle computes it."""
    return F.cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels)).item()
