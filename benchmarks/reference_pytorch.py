"""The plain reference: a DistributedDataParallel loop as PyTorch's DDP tutorial writes it.

Run with torchrun from a baked project's folder, so that it trains the project's own model on its
own data (build_model, build_datasets) with the same seed, batch and epochs; everything else
(sampler, wrapper, SGD, a cosine learning rate stepped per epoch, validation) is written here.
Rank 0 prints one JSON line per epoch.
"""

import argparse
import json
import math
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_train.data import build_datasets
from dist_train.model import build_model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--data-dir", required=True)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--first-step-file", help="rank 0 writes a line here after its first step")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
train_set, val_set, num_classes = build_datasets(
    SimpleNamespace(synthetic=False, data_dir=args.data_dir, seed=args.seed)
)
train_sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
val_loader = DataLoader(val_set, batch_size=args.batch_size, sampler=DistributedSampler(val_set, shuffle=False))

torch.manual_seed(args.seed)
model = DistributedDataParallel(build_model(num_classes))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.5 * (1 + math.cos(math.pi * e / args.epochs)))

first_step = True
for epoch in range(1, args.epochs + 1):
    started = time.perf_counter()
    train_sampler.set_epoch(epoch)
    model.train()
    loss_sum, seen = 0.0, 0
    for images, labels in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(labels)
        seen += len(labels)
        if first_step and rank == 0 and args.first_step_file:
            with open(args.first_step_file, "w") as file:
                file.write("first step\n")
        first_step = False
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
    scheduler.step()
    if rank == 0:
        record = {
            "epoch": epoch,
            "train_loss": (totals[0] / totals[1]).item(),
            "val_acc": (totals[2] / totals[3]).item(),
        }
        print(json.dumps(record | {"epoch_time_s": time.perf_counter() - started}), flush=True)
dist.barrier()  # gloo can abort a rank whose peer tears down the group while it still talks to it
dist.destroy_process_group()
