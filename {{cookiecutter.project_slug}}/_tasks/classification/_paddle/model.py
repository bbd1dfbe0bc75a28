"""The network and its optimizer. Extension points: replace build_model() and build_optimizer() with your own
(the loss is task.py's).

Any paddle.nn.Layer works: distributed.wrap_model() adds DataParallel around
it, and checkpoints store the unwrapped model's state dict.
"""

import math

import paddle
from paddle import nn

# PyTorch's default weights, uniform in +-1/sqrt(fan_in): paddle's own are about twice as large
# (Kaiming normal for convolutions), and with them this network diverges on noisy inputs at --lr 0.05.
_TORCH_INIT = nn.initializer.KaimingUniform(negative_slope=math.sqrt(5), nonlinearity="leaky_relu")


def build_model(num_classes: int, channels: int = 3, width: int = 128) -> nn.Layer:
    """A small CNN for images of any size; `channels` comes from the data (--channels) when you keep the parameter,
    `width` (the hidden layer's features) from --model-option width=N (4096: 4 million parameters)."""
    return nn.Sequential(
        nn.Conv2D(channels, 32, kernel_size=3, padding=1, weight_attr=_TORCH_INIT),
        nn.ReLU(),
        nn.MaxPool2D(2),
        nn.Conv2D(32, 64, kernel_size=3, padding=1, weight_attr=_TORCH_INIT),
        nn.ReLU(),
        nn.AdaptiveAvgPool2D(4),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, width, weight_attr=_TORCH_INIT),
        nn.ReLU(),
        nn.Linear(width, num_classes, weight_attr=_TORCH_INIT),
    )


def build_optimizer(model: nn.Layer, lr: float) -> paddle.optimizer.Optimizer:
    """Momentum SGD at --lr; run.py puts the cosine schedule on top of whatever this returns."""
    return paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=model.parameters())
