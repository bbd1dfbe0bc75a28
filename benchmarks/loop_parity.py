"""Loop parity in one run: a baked project's train_one_epoch() + evaluate() against the plain loop of
reference_<framework>.py.

Started by the framework's launcher (2 processes) with a baked project's folder, the epochs, an
output file and the framework as arguments. Both loops train the same wrapped model (the project's
wrappers: DDP, DataParallel or fleet's) on the project's data, taking turns epoch by epoch (A B,
then B A), so that the drifts of a noisy machine hit both alike. Rank 0 writes a JSON line of
per-epoch seconds.
"""

import importlib
import json
import sys
import time

project, EPOCHS, seconds_file, framework = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, project)
from dist_train import cli, distributed, engine, loaders, seam  # noqa: E402
from dist_train.logs import LoaderWatch  # noqa: E402
from dist_train.preemption import EpochProgress, StopRequest  # noqa: E402

reference = importlib.import_module(f"reference_{framework}")

args = cli.parse_args(["--device", "cpu", "--data-dir", f"{project}/data/digits"])
env = distributed.setup("cpu", 600)
task = seam.Task()
train_set, val_set, outputs = task.datasets(args)
train_loader, val_loader = loaders.build_loaders(train_set, val_set, args.batch_size, 0, args.seed, env)
model = distributed.wrap_model(task.network(seam.data_description(train_set, outputs)), env)
scaler = engine.grad_scaler(None)  # full precision, as on CPUs
model, optimizer, scaler = distributed.wrap_optimizer(model, task.optimizer(model, cli.DEFAULT_LR), scaler)
watch = LoaderWatch.of(train_loader, env)  # as training.py times every batch
plain_train, plain_val = reference.plain_loaders(train_set, val_set, args.batch_size, args.seed)


def baked_epoch(epoch: int) -> None:
    # A fresh stop request: its votes would otherwise count the plain loop's epochs as its own steps.
    engine.train_one_epoch(
        model, train_loader, optimizer, scaler, env, epoch, EpochProgress(), StopRequest(), task, watch=watch
    )
    engine.evaluate(model, val_loader, env, task)


def plain_epoch(epoch: int) -> None:
    reference.plain_epoch(model, optimizer, plain_train, plain_val, epoch)


seconds = {"baked": [], "plain": []}
for epoch in range(1, EPOCHS + 1):
    order = [("baked", baked_epoch), ("plain", plain_epoch)]
    for name, run_epoch in order if epoch % 2 else reversed(order):
        distributed.barrier()
        started = time.perf_counter()
        run_epoch(epoch)
        seconds[name].append(time.perf_counter() - started)
if env.is_main:
    with open(seconds_file, "w") as output:
        output.write(json.dumps(seconds))
distributed.cleanup()
