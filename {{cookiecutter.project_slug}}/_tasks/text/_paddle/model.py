"""The network and its optimizer. Extension points: replace build_model() and build_optimizer() with your own
(the loss is task.py's).

Any paddle.nn.Layer works: distributed.wrap_model() adds DataParallel around
it, and checkpoints store the unwrapped model's state dict. task.py calls
it as model(input_ids, attention_mask), the batch's two [batch, length] tensors.
"""

import math

import paddle
from paddle import nn

EMBEDDING = 64
HIDDEN = 64
# PyTorch's default weights (embeddings normal with std 1, linear layers uniform in +-1/sqrt(fan_in)): with
# paddle's own, much smaller embeddings, the default --lr trains this network another way than its PyTorch twin.
_TORCH_EMBEDDING = nn.initializer.Normal(0.0, 1.0)
_TORCH_INIT = nn.initializer.KaimingUniform(negative_slope=math.sqrt(5), nonlinearity="leaky_relu")


class TextClassifier(nn.Layer):
    """Token embeddings, averaged over each text's real tokens (not its padding), then a small MLP."""

    def __init__(self, num_classes: int, vocab_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, EMBEDDING, padding_idx=0, weight_attr=_TORCH_EMBEDDING)
        self.head = nn.Sequential(
            nn.Linear(EMBEDDING, HIDDEN, weight_attr=_TORCH_INIT),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(HIDDEN, num_classes, weight_attr=_TORCH_INIT),
        )

    def forward(self, input_ids: paddle.Tensor, attention_mask: paddle.Tensor) -> paddle.Tensor:
        embedded = self.embedding(input_ids)
        mask = attention_mask.unsqueeze(-1).astype(embedded.dtype)
        # A text with no tokens averages to zeros, not to 0 / 0.
        pooled = (embedded * mask).sum(axis=1) / mask.sum(axis=1).clip(min=1)
        return self.head(pooled)


def build_model(num_classes: int, vocab_size: int = 20_000) -> nn.Layer:
    """`vocab_size` comes from the data (the vocabulary data.py built) when you keep the parameter."""
    return TextClassifier(num_classes, vocab_size)


def build_optimizer(model: nn.Layer, lr: float) -> paddle.optimizer.Optimizer:
    """AdamW at --lr (the default 0.05 suits this small network: 0.96 to 0.97 val_auc on the sample in 10 epochs);
    run.py puts the cosine schedule on top of whatever this returns."""
    return paddle.optimizer.AdamW(learning_rate=lr, parameters=model.parameters(), weight_decay=0.01)
