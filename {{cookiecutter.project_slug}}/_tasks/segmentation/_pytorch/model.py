"""The network and its optimizer. Extension points: replace build_model() and build_optimizer() with your own
(the loss is task.py's).

Any torch.nn.Module that maps images [B, channels, H, W] to class scores [B, classes, H, W] works:
distributed.wrap_model() moves it to the device and adds DDP around it, and checkpoints store the
unwrapped model's state dict.
"""

import torch
from torch import nn

WIDTH = 16  # channels at full resolution; each pooling step doubles them
# AdamW's steps are the size of its rate whatever the gradient's: the template's --lr default 0.05 (SGD's) is
# too large for them, and SGD itself stalls on this network (it finds the strokes, never which digit they draw).
ADAMW_SHARE_OF_LR = 0.2


def conv(inputs: int, outputs: int) -> nn.Sequential:
    """A 3x3 convolution, normalised and rectified."""
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU()
    )


class TinyUNet(nn.Module):
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
        self.up_to_half = nn.ConvTranspose2d(4 * width, 2 * width, kernel_size=2, stride=2)
        self.decode_half = conv(4 * width, 2 * width)
        self.up_to_full = nn.ConvTranspose2d(2 * width, width, kernel_size=2, stride=2)
        self.decode_full = conv(2 * width, width)
        self.head = nn.Conv2d(width, num_classes, kernel_size=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        height, width = images.shape[-2:]
        full = self.encode_full(nn.functional.pad(images, (0, -width % 4, 0, -height % 4)))
        half = self.encode_half(self.pool(full))
        quarter = self.encode_quarter(self.pool(half))
        half = self.decode_half(torch.cat([self.up_to_half(quarter), half], dim=1))
        full = self.decode_full(torch.cat([self.up_to_full(half), full], dim=1))
        return self.head(full)[..., :height, :width]


def build_model(num_classes: int, channels: int = 3) -> nn.Module:
    """The network for `num_classes` classes (background included); `channels` comes from the data (--channels)
    when you keep the parameter."""
    return TinyUNet(num_classes, channels)


def build_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW at a fifth of --lr (0.01 at the default 0.05); run.py puts the cosine schedule on top of whatever this
    returns."""
    return torch.optim.AdamW(model.parameters(), lr=lr * ADAMW_SHARE_OF_LR)
