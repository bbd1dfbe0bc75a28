"""The network and its optimizer. Extension points: replace build_model() and build_optimizer() with your own
(the loss is task.py's).

Any torch.nn.Module works: distributed.wrap_model() moves it to the device and adds
DDP around it, and checkpoints store the unwrapped model's state dict.
"""

import torch
from torch import nn


def build_model(num_classes: int, channels: int = 3, width: int = 128) -> nn.Module:
    """A small CNN for images of any size; `channels` comes from the data (--channels) when you keep the parameter,
    `width` (the hidden layer's features) from --model-option width=N: 4096 makes it big enough (4 million
    parameters) to see --strategy fsdp shrink what each process holds."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, width),
        nn.ReLU(),
        nn.Linear(width, num_classes),
    )


def build_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """SGD with momentum at --lr; run.py puts the cosine schedule on top of whatever this returns."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
