"""Loop parity in one run: a baked project's train_one_epoch() + evaluate() against a plain DataParallel loop.

Started by paddle's launch (2 processes) with a baked project's folder as argv[1]; a fleetrun
project's wrappers are fleet's. Both loops train the same wrapped model on the project's data,
taking turns epoch by epoch (A B, then B A), so that the drifts of a noisy machine hit both alike.
Rank 0 writes a JSON line of per-epoch seconds to argv[3].
"""

import json
import sys
import time

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle.io import DataLoader, DistributedBatchSampler

sys.path.insert(0, sys.argv[1])
from dist_train import cli, distributed, engine, loaders, preemption  # noqa: E402
from dist_train.data import build_datasets  # noqa: E402
from dist_train.model import build_model  # noqa: E402

EPOCHS = int(sys.argv[2])

args = cli.parse_args(["--device", "cpu", "--data-dir", f"{sys.argv[1]}/data/digits"])
env = distributed.setup("cpu", 600)
train_set, val_set, num_classes = build_datasets(args)
train_loader, val_loader = loaders.build_loaders(train_set, val_set, args, env)
model = distributed.wrap_model(build_model(num_classes), env)
optimizer = distributed.wrap_optimizer(paddle.optimizer.Momentum(args.lr, momentum=0.9, parameters=model.parameters()))
scaler = paddle.amp.GradScaler(enable=False)

plain_sampler = DistributedBatchSampler(train_set, args.batch_size, shuffle=True)
plain_train = DataLoader(train_set, batch_sampler=plain_sampler)
plain_val = DataLoader(val_set, batch_sampler=DistributedBatchSampler(val_set, args.batch_size, shuffle=False))


def baked_epoch(epoch: int) -> None:
    train_loader.batch_sampler.set_epoch(epoch)
    # A fresh stop request: its votes would otherwise count the plain loop's epochs as its own steps.
    stop = preemption.StopRequest()
    engine.train_one_epoch(model, train_loader, optimizer, scaler, env, args, epoch, preemption.EpochProgress(), stop)
    engine.evaluate(model, val_loader, env, use_amp=False)


def plain_epoch(epoch: int) -> None:
    plain_sampler.set_epoch(epoch)
    model.train()
    loss_sum, seen = 0.0, 0
    for images, labels in plain_train:
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        loss_sum += loss.item() * len(labels)
        seen += len(labels)
    model.eval()
    val_loss, correct, total = 0.0, 0, 0
    with paddle.no_grad():
        for images, labels in plain_val:
            logits = distributed.unwrap(model)(images)
            val_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).astype("int64").sum().item()
            total += len(labels)
    dist.all_reduce(paddle.to_tensor([loss_sum, seen, correct, total, val_loss], dtype="float64"))


seconds = {"baked": [], "plain": []}
for epoch in range(1, EPOCHS + 1):
    order = [("baked", baked_epoch), ("plain", plain_epoch)]
    for name, run_epoch in order if epoch % 2 else reversed(order):
        dist.barrier()
        started = time.perf_counter()
        run_epoch(epoch)
        seconds[name].append(time.perf_counter() - started)
if env.is_main:
    with open(sys.argv[3], "w") as output:
        output.write(json.dumps(seconds))
distributed.cleanup()
