"""What paddle.Model.fit needs around it: the data loaders, an epoch callback, and exact evaluation.

fit() runs the training steps; EpochEnd, a fit callback, reshuffles the data
every epoch, logs the loss, sums each epoch's loss and samples over all ranks
and hands them to the caller's end-of-epoch function (validation, metrics,
checkpoints). Validation is not Model.evaluate: that reports each rank's shard
only, and its sampler pads shards with repeated samples. evaluate() here counts
every validation sample exactly once, over all ranks.
"""

import logging
import math
import random
import time

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.io import BatchSampler, DataLoader, Dataset, DistributedBatchSampler, Sampler

from . import distributed
from .distributed import DistEnv

log = logging.getLogger(__name__)


class ShardSampler(Sampler):
    """Rank r takes samples r, r + world, r + 2*world, ...: every sample exactly once, no padding.

    DistributedBatchSampler pads shards to equal length with repeated samples,
    which would count some validation samples twice.
    """

    def __init__(self, dataset_size: int, env: DistEnv):
        super().__init__()
        self.indices = range(env.rank, dataset_size, env.world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def build_loaders(train_set: Dataset, val_set: Dataset, args, env: DistEnv) -> tuple[DataLoader, DataLoader]:
    """Loaders of --batch-size samples per process; the train sampler reshuffles with set_epoch()."""
    train_sampler = DistributedBatchSampler(
        train_set, args.batch_size, num_replicas=env.world_size, rank=env.rank, shuffle=True
    )
    val_sampler = BatchSampler(sampler=ShardSampler(len(val_set), env), batch_size=args.batch_size)
    common = dict(num_workers=args.workers, persistent_workers=args.workers > 0)
    train_loader = DataLoader(train_set, batch_sampler=train_sampler, **common)
    val_loader = DataLoader(val_set, batch_sampler=val_sampler, **common)
    return train_loader, val_loader


def accumulated_loss(grad_accum: int):
    """Cross-entropy for Model.prepare().

    fit() sums the gradients of --grad-accum micro-batches; each loss divided by
    their number makes the sum a mean, as one big batch (and the basic loop) gives.
    """
    return lambda logits, labels: F.cross_entropy(logits, labels) / grad_accum


class EpochEnd(paddle.callbacks.Callback):
    """A fit() callback: per-epoch shuffle and loss lines, then end_epoch(epoch, train_stats, started) on every rank.

    train_stats holds the mean loss and the distinct samples seen by all ranks, as
    the basic loop's train_one_epoch() returns them, and the learning rate the epoch
    trained with (fit's LRScheduler callback has stepped it by then). fit() counts
    its epochs from 0; the epochs here continue a resumed run: first_epoch + 1, ...
    """

    def __init__(self, loader: DataLoader, env: DistEnv, args, first_epoch: int, end_epoch):
        super().__init__()
        self.loader, self.env, self.args = loader, env, args
        self.first_epoch, self.end_epoch = first_epoch, end_epoch

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.epoch = self.first_epoch + epoch + 1
        self.started = time.perf_counter()
        self.loader.batch_sampler.set_epoch(self.epoch)  # a new shuffle every epoch, the same on every rank
        self.loss_sum, self.seen = 0.0, 0
        self.lr = self.model._optimizer.get_lr()  # where paddle's LRScheduler callback finds the optimizer too

    def on_train_batch_end(self, step: int, logs=None) -> None:
        batch = logs["batch_size"] // self.env.world_size  # fit reports the batch of all ranks together
        # fit reports the loss of accumulated_loss(), divided by --grad-accum: undo that.
        self.loss_sum += logs["loss"][0] * self.args.grad_accum * batch
        self.seen += batch
        if (step + 1) % self.args.log_every == 0 and self.env.is_main:
            log.info("epoch %d step %d/%d loss %.4f", self.epoch, step + 1, len(self.loader), self.loss_sum / self.seen)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        total_loss, total_seen = distributed.all_reduce_sum([self.loss_sum, self.seen], self.env)
        # DistributedBatchSampler repeats a few samples so every rank gets as many; they are not distinct.
        padding = self.loader.batch_sampler.total_size - len(self.loader.dataset)
        train_stats = {"loss": total_loss / total_seen, "samples": int(total_seen) - padding, "lr": self.lr}
        self.end_epoch(self.epoch, train_stats, self.started)


@paddle.no_grad()
def evaluate(model, loader: DataLoader, env: DistEnv, use_amp: bool) -> dict:
    """Loss and accuracy over the whole validation set, each sample counted once across ranks."""
    model.eval()
    loss_sum = paddle.zeros([])
    correct = paddle.zeros([])
    count = 0
    for images, labels in loader:
        with paddle.amp.auto_cast(enable=use_amp):
            logits = model(images)
        loss_sum += F.cross_entropy(logits.astype("float32"), labels, reduction="sum")
        correct += (logits.argmax(axis=1) == labels).astype("float32").sum()
        count += len(labels)
    total_loss, total_correct, total = distributed.all_reduce_sum([loss_sum.item(), correct.item(), count], env)
    return {"loss": total_loss / max(total, 1), "acc": total_correct / max(total, 1), "samples": int(total)}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def cosine_schedule(lr: float, epochs: int) -> paddle.optimizer.lr.LambdaDecay:
    """Cosine decay from `lr` towards 0 over `epochs`, stepped once per epoch.

    A closed form of the epoch: a run resumed with a larger --epochs follows the new horizon
    (CosineAnnealingDecay derives each rate from the previous one, so it would keep the old one).
    """
    return paddle.optimizer.lr.LambdaDecay(lr, lambda epoch: 0.5 * (1 + math.cos(math.pi * epoch / epochs)))


def reapply_schedule(scheduler: paddle.optimizer.lr.LRScheduler) -> None:
    """Set the learning rate the schedule gives at its current epoch.

    After a resume the scheduler holds the saved run's last_lr, from a schedule a larger
    --epochs has changed; the optimizer takes last_lr at every step.
    """
    scheduler.last_lr = scheduler.get_lr()
