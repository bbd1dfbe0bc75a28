"""test_evaluate.py's PyTorch side: the validation step of its small classification task, its data as tensors, the
loss it expects, and the layers it builds its models of (both frameworks' nn name them alike)."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn  # noqa: F401 - test_evaluate.py's layers
from torch.utils.data import TensorDataset


def validation_step(model, batch) -> tuple[dict, dict]:
    inputs, labels = batch
    logits = model(inputs).float()
    sums = {"loss": F.cross_entropy(logits, labels, reduction="sum"), "correct": (logits.argmax(dim=1) == labels).sum()}
    return sums, {"labels": labels}


def dataset(inputs: np.ndarray, labels: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(inputs), torch.from_numpy(labels))


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """The mean cross-entropy of these logits and labels, as PyTorch computes it."""
    return F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels)).item()
