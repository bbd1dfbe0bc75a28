"""The training and evaluation loops.

Per step there is no host synchronisation: the running loss stays on the
device and is read every --log-every steps only.
"""

import contextlib
import logging
import math
import random
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.io import DataLoader
from tqdm import tqdm

from . import distributed
from .distributed import DistEnv
from .preemption import EpochProgress, StopRequest

log = logging.getLogger(__name__)


def progress_bar(iterable, env: DistEnv, desc: str):
    """A progress bar on rank 0 at a terminal; job logs get the periodic log lines instead."""
    return tqdm(iterable, desc=desc, leave=False, disable=not (env.is_main and sys.stderr.isatty()))


def train_one_epoch(
    model, loader: DataLoader, optimizer, scaler, env: DistEnv, args, epoch: int, progress: EpochProgress,
    stop: StopRequest,
) -> dict | None:  # fmt: skip
    """One pass over this rank's shard; returns the mean loss and the distinct samples seen by all ranks.

    The pass starts after `progress.step` batches (non-zero when a stopped epoch goes on). When
    `stop` asks for it, the pass ends early after an optimizer step: `progress` then says where,
    and the return value is None.
    """
    model.train()
    loss_sum = paddle.to_tensor(progress.loss_sum, dtype="float32")
    seen = progress.seen
    loader.batch_sampler.skip = progress.step
    steps = progress.step + len(loader)
    use_amp = scaler.is_enable()
    for step, (images, labels) in enumerate(progress_bar(loader, env, f"epoch {epoch}"), start=progress.step + 1):
        steps_now = step % args.grad_accum == 0 or step == steps
        # Gradients are all-reduced only on the micro-batch that steps the optimizer.
        sync = contextlib.nullcontext() if steps_now or env.world_size == 1 else model.no_sync()
        with sync:
            with paddle.amp.auto_cast(enable=use_amp):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss / args.grad_accum).backward()
        if steps_now:
            scaler.step(optimizer)
            scaler.update()
            optimizer.clear_grad()
        loss_sum += loss.detach() * len(labels)
        seen += len(labels)
        if step % args.log_every == 0 and env.is_main:
            log.info("epoch %d step %d/%d loss %.4f", epoch, step, steps, loss_sum.item() / seen)
        # The last step needs no check: run.py checks again once the epoch is saved.
        if steps_now and step < steps and stop.stop_now(env):
            progress.step, progress.loss_sum, progress.seen = step, loss_sum.item(), seen
            return None
    total_loss, total_seen = distributed.all_reduce_sum([loss_sum.item(), seen], env)
    # DistributedBatchSampler repeats a few samples so every rank gets as many; they are not distinct.
    padding = loader.batch_sampler.total_size - len(loader.dataset)
    return {"loss": total_loss / total_seen, "samples": int(total_seen) - padding}


@paddle.no_grad()
def evaluate(model, loader: DataLoader, env: DistEnv, use_amp: bool) -> dict:
    """Loss and accuracy over the whole validation set, each sample counted once across ranks."""
    # The unwrapped model: ranks may run different numbers of batches, and only training needs the wrapper.
    model = distributed.unwrap(model)
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
