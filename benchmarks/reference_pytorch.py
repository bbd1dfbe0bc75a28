"""The plain reference: a DistributedDataParallel loop as PyTorch's DDP tutorial writes it.

Run with torchrun from a baked project's folder, so that it trains the project's own model on its
own data (build_model, build_datasets) with the same seed, batch and epochs; everything else
(sampler, wrapper, SGD, a cosine learning rate stepped per epoch, validation) is written here.
Rank 0 prints one JSON line per epoch. loop_parity.py runs plain_epoch() beside the project's loop.
"""

import math
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import reference_arguments, reference_epochs
from dist_train.data import build_datasets
from dist_train.model import build_model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def plain_loaders(train_set, val_set, batch_size: int, seed: int) -> tuple[DataLoader, DataLoader]:
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=batch_size, sampler=DistributedSampler(val_set, shuffle=False))
    return train_loader, val_loader


def plain_epoch(model, optimizer, train_loader, val_loader, epoch: int, after_step=lambda: None) -> list[float]:
    """One epoch of training and validation; [train loss sum, seen, correct, total, val loss sum] of all ranks."""
    train_loader.sampler.set_epoch(epoch)
    model.train()
    loss_sum, seen = 0.0, 0
    for images, labels in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(labels)
        seen += len(labels)
        after_step()
    model.eval()
    val_loss, correct, total = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in val_loader:
            logits = model.module(images)
            val_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).sum().item()
            total += len(labels)
    totals = torch.tensor([loss_sum, seen, correct, total, val_loss], dtype=torch.float64)
    dist.all_reduce(totals)
    return totals.tolist()


def main() -> None:
    args = reference_arguments()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train_set, val_set, num_classes = build_datasets(
        SimpleNamespace(synthetic=False, data_dir=args.data_dir, seed=args.seed)
    )
    train_loader, val_loader = plain_loaders(train_set, val_set, args.batch_size, args.seed)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(build_model(num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.5 * (1 + math.cos(math.pi * e / args.epochs)))

    reference_epochs(args, rank, partial(plain_epoch, model, optimizer, train_loader, val_loader), schedule)
    dist.barrier()  # gloo can abort a rank whose peer tears down the group while it still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
