"""The network and its optimizer. Extension points: replace build_model() and build_optimizer() with your own
(the loss is task.py's).

Any paddle.nn.Layer that maps images [B, channels, H, W] to class scores [B, classes, H, W] works:
distributed.wrap_model() adds DataParallel around it, and checkpoints store the unwrapped model's
state dict.
"""

import warnings

import paddle
from paddle import nn

# Paddle's batch norm says at every training step that it tracks running statistics, as it always does.
warnings.filterwarnings("ignore", "When training, we now always track global mean and variance")

WIDTH = 16  # channels at full resolution; each pooling step doubles them
# AdamW's steps are the size of its rate whatever the gradient's: the template's --lr default 0.05 (SGD's) is
# too large for them, and SGD itself stalls on this network (it finds the strokes, never which digit they draw).
ADAMW_SHARE_OF_LR = 0.2


def conv(inputs: int, outputs: int) -> nn.Sequential:
    """A 3x3 convolution, normalised and rectified."""
    return nn.Sequential(
        nn.Conv2D(inputs, outputs, kernel_size=3, padding=1, bias_attr=False), nn.BatchNorm2D(outputs), nn.ReLU()
    )


class TinyUNet(nn.Layer):
    """A small U-Net: two pooling steps down, where three convolutions see a whole 16-pixel digit (which class its
    strokes are), then back up to full resolution, where the skip connections give back each pixel's place.
    Convolutions only, so a digit anywhere in the image is read the same way. Sides that are not multiples of 4
    are padded, and the scores cropped back: [B, channels, H, W] in, [B, num_classes, H, W] out."""

    def __init__(self, num_classes: int, channels: int = 3, width: int = WIDTH):
        super().__init__()
        self.encode_full = conv(channels, width)
        self.encode_half = nn.Sequential(conv(width, 2 * width), conv(2 * width, 2 * width))
        self.encode_quarter = nn.Sequential(
            conv(2 * width, 4 * width), conv(4 * width, 4 * width), conv(4 * width, 4 * width)
        )
        self.up_to_half = nn.Conv2DTranspose(4 * width, 2 * width, kernel_size=2, stride=2)
        self.decode_half = conv(4 * width, 2 * width)
        self.up_to_full = nn.Conv2DTranspose(2 * width, width, kernel_size=2, stride=2)
        self.decode_full = conv(2 * width, width)
        self.head = nn.Conv2D(width, num_classes, kernel_size=1)
        self.pool = nn.MaxPool2D(2)

    def forward(self, images: paddle.Tensor) -> paddle.Tensor:
        height, width = images.shape[-2:]
        full = self.encode_full(nn.functional.pad(images, [0, -width % 4, 0, -height % 4]))
        half = self.encode_half(self.pool(full))
        quarter = self.encode_quarter(self.pool(half))
        half = self.decode_half(paddle.concat([self.up_to_half(quarter), half], axis=1))
        full = self.decode_full(paddle.concat([self.up_to_full(half), full], axis=1))
        return self.head(full)[:, :, :height, :width]


def build_model(num_classes: int, channels: int = 3) -> nn.Layer:
    """The network for `num_classes` classes (background included); `channels` comes from the data (--channels)
    when you keep the parameter."""
    return TinyUNet(num_classes, channels)


def build_optimizer(model: nn.Layer, lr: float) -> paddle.optimizer.Optimizer:
    """AdamW at a fifth of --lr (0.01 at the default 0.05); run.py puts the cosine schedule on top of whatever this
    returns."""
    return paddle.optimizer.AdamW(learning_rate=lr * ADAMW_SHARE_OF_LR, parameters=model.parameters())
