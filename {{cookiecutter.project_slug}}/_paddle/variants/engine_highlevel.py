"""What paddle.Model.fit needs around it: an epoch callback, and exact evaluation.

fit() runs the training steps; EpochEnd, a fit callback, reshuffles the data
every epoch, logs the loss, sums each epoch's loss and samples over all ranks
and hands them to the caller's end-of-epoch function (validation, metrics,
checkpoints). After each optimizer step it asks whether a SIGTERM stops the
run, and then hands where the epoch stands to the caller's stop function. Validation is not Model.evaluate: that reports each rank's shard
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
from paddle.io import DataLoader

from . import distributed
from .distributed import DistEnv
from .preemption import EpochProgress, StopRequest

log = logging.getLogger(__name__)


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
    its epochs from 0; the epochs here continue a resumed run: first_epoch + 1, ...,
    the first of them after `progress.step` batches when a stopped epoch goes on.
    When `stop` asks for it, stop_in_epoch(epoch, progress) saves and ends the process.
    """

    def __init__(
        self, loader: DataLoader, env: DistEnv, args, first_epoch: int, progress: EpochProgress, stop: StopRequest,
        end_epoch, stop_in_epoch,
    ):  # fmt: skip
        super().__init__()
        self.loader, self.env, self.args = loader, env, args
        self.first_epoch, self.progress, self.stop = first_epoch, progress, stop
        self.end_epoch, self.stop_in_epoch = end_epoch, stop_in_epoch

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.epoch = self.first_epoch + epoch + 1
        self.started = time.perf_counter()
        self.loader.batch_sampler.set_epoch(self.epoch)  # a new shuffle every epoch, the same on every rank
        self.loader.batch_sampler.skip = self.progress.step  # fit() starts iterating right after this
        self.steps = self.progress.step + len(self.loader)
        self.lr = self.model._optimizer.get_lr()  # where paddle's LRScheduler callback finds the optimizer too

    def on_train_batch_end(self, step: int, logs=None) -> None:
        batch = logs["batch_size"] // self.env.world_size  # fit reports the batch of all ranks together
        # fit reports the loss of accumulated_loss(), divided by --grad-accum: undo that.
        progress = self.progress
        progress.loss_sum += logs["loss"][0] * self.args.grad_accum * batch
        progress.seen += batch
        progress.step += 1
        if progress.step % self.args.log_every == 0 and self.env.is_main:
            mean_loss = progress.loss_sum / progress.seen
            log.info("epoch %d step %d/%d loss %.4f", self.epoch, progress.step, self.steps, mean_loss)
        # fit() has just stepped the optimizer (it does every --grad-accum batches); the last step needs no check.
        if progress.step % self.args.grad_accum == 0 and progress.step < self.steps and self.stop.stop_now(self.env):
            self.stop_in_epoch(self.epoch, self.progress)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        total_loss, total_seen = distributed.all_reduce_sum([self.progress.loss_sum, self.progress.seen], self.env)
        # DistributedBatchSampler repeats a few samples so every rank gets as many; they are not distinct.
        padding = self.loader.batch_sampler.total_size - len(self.loader.dataset)
        train_stats = {"loss": total_loss / total_seen, "samples": int(total_seen) - padding, "lr": self.lr}
        self.progress = EpochProgress()
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
