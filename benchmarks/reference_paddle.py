"""The plain reference: a paddle.DataParallel loop as Paddle's data-parallel guide writes it.

Run with python -m paddle.distributed.launch from a baked project's folder, so that it trains the
project's own model on its own data (build_model, build_datasets) with the same seed, batch and
epochs; everything else (sampler, wrapper, Momentum, a cosine learning rate stepped per epoch,
validation) is written here. Rank 0 prints one JSON line per epoch. loop_parity.py runs
plain_epoch() beside the project's loop.
"""

import math
import os
from functools import partial
from types import SimpleNamespace

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from common import reference_arguments, reference_epochs
from dist_train.data import build_datasets
from dist_train.model import build_model
from paddle.io import DataLoader, DistributedBatchSampler


def plain_loaders(train_set, val_set, batch_size: int, seed: int) -> tuple[DataLoader, DataLoader]:
    """(DistributedBatchSampler shuffles by the epoch alone: `seed` is PyTorch's.)"""
    train_loader = DataLoader(train_set, batch_sampler=DistributedBatchSampler(train_set, batch_size, shuffle=True))
    val_loader = DataLoader(val_set, batch_sampler=DistributedBatchSampler(val_set, batch_size, shuffle=False))
    return train_loader, val_loader


def plain_epoch(model, optimizer, train_loader, val_loader, epoch: int, after_step=lambda: None) -> list[float]:
    """One epoch of training and validation; [train loss sum, seen, correct, total, val loss sum] of all ranks."""
    train_loader.batch_sampler.set_epoch(epoch)
    model.train()
    loss_sum, seen = 0.0, 0
    for images, labels in train_loader:
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        loss_sum += loss.item() * len(labels)
        seen += len(labels)
        after_step()
    model.eval()
    val_loss, correct, total = 0.0, 0, 0
    with paddle.no_grad():
        for images, labels in val_loader:
            logits = model._layers(images) if isinstance(model, paddle.DataParallel) else model(images)
            val_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).astype("int64").sum().item()
            total += len(labels)
    totals = paddle.to_tensor([loss_sum, seen, correct, total, val_loss], dtype="float64")
    dist.all_reduce(totals)
    return totals.tolist()


def main() -> None:
    args = reference_arguments()

    paddle.set_device("cpu")
    os.environ["PADDLE_DISTRI_BACKEND"] = "gloo"
    dist.init_parallel_env()
    rank = dist.get_rank()
    train_set, val_set, num_classes = build_datasets(
        SimpleNamespace(synthetic=False, data_dir=args.data_dir, seed=args.seed)
    )
    train_loader, val_loader = plain_loaders(train_set, val_set, args.batch_size, args.seed)
    paddle.seed(args.seed)
    model = paddle.DataParallel(build_model(num_classes))
    schedule = paddle.optimizer.lr.LambdaDecay(args.lr, lambda e: 0.5 * (1 + math.cos(math.pi * e / args.epochs)))
    optimizer = paddle.optimizer.Momentum(schedule, momentum=0.9, parameters=model.parameters())

    reference_epochs(args, rank, partial(plain_epoch, model, optimizer, train_loader, val_loader), schedule)


if __name__ == "__main__":
    main()
