"""How the network trains, for training.py: prepare() makes it trainable (the wrapper of --strategy, the optimizer,
its schedule, mixed precision), run_epochs() runs the epochs, each a pass of engine.train_one_epoch() and then
validation, its metrics and saves. (A Paddle project baked with paddle_api=highlevel has paddle.Model.fit here.)"""

import time
from dataclasses import dataclass

from . import cli, distributed, engine


@dataclass
class Trainable:
    """The network made trainable: `model` is what trains, is validated and saved (the network in the wrapper of
    --strategy); `amp_dtype` ("bf16", "fp16", None) the run's mixed precision."""

    model: object
    optimizer: object
    schedule: object
    scaler: object
    amp_dtype: str | None


def prepare(network, train_loader, env: distributed.DistEnv, task, args) -> Trainable:
    amp_dtype = engine.mixed_precision(args.amp, args.amp_dtype, env)
    model = distributed.wrap_model(
        network, env, args.find_unused_parameters, args.compile, args.channels_last, args.strategy,
        args.activation_checkpointing, amp_dtype, task.units, args.reshard_after_forward,
    )  # fmt: skip
    engine.seed_everything(args.seed + env.rank)  # then each rank its own random stream
    optimizer = task.optimizer(model, cli.DEFAULT_LR if args.lr is None else args.lr)
    schedule = engine.cosine_schedule(optimizer, args.epochs)
    scaler = engine.grad_scaler(amp_dtype)
    model, optimizer, scaler = distributed.wrap_optimizer(model, optimizer, scaler, args.strategy)
    return Trainable(model, optimizer, schedule, scaler, amp_dtype)


def run_epochs(
    trained: Trainable, train_loader, val_loader, env, state, stop, task, args, saves, tracker, metrics, watch
) -> None:
    """The epochs after the state's (none once --patience stopped the run): each trains, then validates (the weights
    --ema averages, if any), reports to `metrics` and `tracker`, ends at the Checkpointer `saves`, votes on a stop."""
    for epoch in range(state.epochs_done + 1, args.epochs + 1):
        if state.stops_early(args.patience):  # (a rerun of a stopped run too: it trains nothing)
            break
        started = time.perf_counter()
        train_stats = engine.train_one_epoch(
            trained.model, train_loader, trained.optimizer, trained.scaler, env, epoch, state.progress, stop, task,
            grad_accum=args.grad_accum, log_every=args.log_every, tracker=tracker, watch=watch,
            amp_dtype=trained.amp_dtype, clip_grad_norm=args.clip_grad_norm, saves=saves, schedule=trained.schedule,
            ema=saves.ema,
        )  # fmt: skip
        with engine.collective_timeouts(f"epoch {epoch}'s validation and save", env):
            with saves.ema.swapped():  # validation, and so best.*, --patience and --keep-best: the averaged weights
                val_stats = engine.evaluate(trained.model, val_loader, env, task, trained.amp_dtype)
            tracker.epoch(epoch, metrics.report(epoch, train_stats, val_stats, started))
            saves.end_epoch(epoch, val_stats, args.min_delta)
            stop.after_epoch(env, epoch, args.epochs)
