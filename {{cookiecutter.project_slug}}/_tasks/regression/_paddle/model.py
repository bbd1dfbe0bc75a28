"""The network and its optimizer. Extension points: replace build_model() and build_optimizer() with your own
(the loss is task.py's).

Any paddle.nn.Layer works: distributed.wrap_model() adds DataParallel around
it, and checkpoints store the unwrapped model's state dict. task.py calls it
with the features for predictions in the target's units, and with the targets too for the errors (in the
target's units and in its standard deviations: the loss's).
"""

import math

import paddle
from paddle import nn

# PyTorch's default weights, uniform in +-1/sqrt(fan_in), as the PyTorch twin of this network starts from.
_TORCH_INIT = nn.initializer.KaimingUniform(negative_slope=math.sqrt(5), nonlinearity="leaky_relu")


class TableRegressor(nn.Layer):
    """A small MLP on the standardised features. It learns the standardised target, (target - mean) / std, and
    answers in the target's units: its output times `target_std`, plus `target_mean` (the training rows', fixed
    buffers; in float32, also under mixed precision)."""

    def __init__(self, num_features: int, outputs: int, target_mean: float, target_std: float, hidden: int = 16):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(num_features, hidden, weight_attr=_TORCH_INIT),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden, outputs, weight_attr=_TORCH_INIT),
        )
        # Not in the state dict: the checkpoint's data description holds them, and build_model() gets them from it.
        self.register_buffer("target_mean", paddle.to_tensor(float(target_mean), dtype="float32"), persistable=False)
        self.register_buffer("target_std", paddle.to_tensor(float(target_std), dtype="float32"), persistable=False)

    def forward(self, features: paddle.Tensor, target: paddle.Tensor | None = None):
        """The predictions; given the targets, their errors (prediction - target) in the target's units, and in its
        standard deviations."""
        prediction = self.layers(features).squeeze(-1).astype("float32") * self.target_std + self.target_mean
        if target is None:
            return prediction
        error = prediction - target.astype("float32")
        return error, error / self.target_std


def build_model(
    num_classes: int, num_features: int = 10, target_mean: float = 0.0, target_std: float = 1.0
) -> nn.Layer:
    """The regressor for `num_features` columns and `num_classes` outputs (1: the target). The data description
    fills in the keyword arguments: the features' count, the target's training mean and standard deviation."""
    return TableRegressor(num_features, num_classes, target_mean, target_std)


def build_optimizer(model: nn.Layer, lr: float) -> paddle.optimizer.Optimizer:
    """AdamW at --lr (default 0.05); run.py puts the cosine schedule on top of whatever this returns."""
    return paddle.optimizer.AdamW(learning_rate=lr, parameters=model.parameters(), weight_decay=0.01)
