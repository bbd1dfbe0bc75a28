"""The network and its optimizer. Extension points: replace build_model() and build_optimizer() with your own
(the loss is task.py's).

Any torch.nn.Module works: distributed.wrap_model() moves it to the device and adds
DDP around it, and checkpoints store the unwrapped model's state dict. task.py calls it
with the features for predictions in the target's units, and with the targets too for the errors (in the
target's units and in its standard deviations: the loss's).
"""

import torch
from torch import nn


class TableRegressor(nn.Module):
    """A small MLP on the standardised features. It learns the standardised target, (target - mean) / std, and
    answers in the target's units: its output times `target_std`, plus `target_mean` (the training rows', fixed
    buffers; in float32, also under mixed precision)."""

    def __init__(self, num_features: int, outputs: int, target_mean: float, target_std: float, hidden: int = 16):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(num_features, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, outputs)
        )
        # Not in the state dict: the checkpoint's data description holds them, and build_model() gets them from it.
        self.register_buffer("target_mean", torch.tensor(float(target_mean)), persistent=False)
        self.register_buffer("target_std", torch.tensor(float(target_std)), persistent=False)

    def forward(self, features: torch.Tensor, target: torch.Tensor | None = None):
        """The predictions; given the targets, their errors (prediction - target) in the target's units, and in its
        standard deviations."""
        prediction = self.layers(features).squeeze(-1).float() * self.target_std + self.target_mean
        if target is None:
            return prediction
        error = prediction - target.float()
        return error, error / self.target_std


def build_model(
    num_classes: int, num_features: int = 10, target_mean: float = 0.0, target_std: float = 1.0
) -> nn.Module:
    """The regressor for `num_features` columns and `num_classes` outputs (1: the target). The data description
    fills in the keyword arguments: the features' count, the target's training mean and standard deviation."""
    return TableRegressor(num_features, num_classes, target_mean, target_std)


def build_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW at --lr (default 0.05); run.py puts the cosine schedule on top of whatever this returns."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
