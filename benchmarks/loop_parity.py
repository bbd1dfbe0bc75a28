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

from common import epochs_in_turn, project_training

project, EPOCHS, seconds_file, framework = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, project)
from dist_train import distributed, engine  # noqa: E402
from dist_train.logs import LoaderWatch  # noqa: E402
from dist_train.preemption import EpochProgress, StopRequest  # noqa: E402

reference = importlib.import_module(f"reference_{framework}")

training = project_training(project)
model, optimizer, env = training.model, training.optimizer, training.env
watch = LoaderWatch.of(training.train_loader, env)  # as training.py times every batch
args = training.args
plain_train, plain_val = reference.plain_loaders(training.train_set, training.val_set, args.batch_size, args.seed)


def baked_epoch(epoch: int) -> None:
    # A fresh stop request: its votes would otherwise count the plain loop's epochs as its own steps.
    engine.train_one_epoch(
        model, training.train_loader, optimizer, training.scaler, env, epoch, EpochProgress(), StopRequest(),
        training.task, watch=watch,
    )  # fmt: skip
    engine.evaluate(model, training.val_loader, env, training.task)


def plain_epoch(epoch: int) -> None:
    reference.plain_epoch(model, optimizer, plain_train, plain_val, epoch)


seconds = epochs_in_turn(EPOCHS, {"baked": baked_epoch, "plain": plain_epoch}, distributed.barrier)
if env.is_main:
    with open(seconds_file, "w") as output:
        output.write(json.dumps(seconds))
distributed.cleanup()
