"""What paddle.Model.fit needs around it: the model, the loss it minimises, and an epoch callback.

fit() runs the training steps. It flattens each batch (a dict by its sorted keys) and splits it
into a network's inputs and labels by the number of forward()'s parameters; TaskLoss takes the
whole flattened batch as its inputs, puts it back in the loader's structure, and returns
task.training_loss(), so every batch reaches the task as the basic loop gives it. EpochEnd, a fit callback, does per epoch what the basic
loop (engine.train_one_epoch) does: it reshuffles the data, logs the loss (to the tracker
too), sums the loss and samples over all ranks and hands them to the caller's end-of-epoch
function (validation, metrics, checkpoints); after each optimizer step it asks whether a
SIGTERM stops the run, and then raises preemption.Stopped, as the basic loop does, or else whether a mid-epoch
checkpoint is due (--save-every-steps); it advances the schedule and the average of --ema after each.
training.py calls prepare() (the model, the optimizer, its schedule, mixed precision) and run_epochs(), as it calls
the basic loop's.
"""

import logging
import math
import time
import warnings
from dataclasses import dataclass, replace

import paddle
from paddle.io import DataLoader
from paddle.static import InputSpec

from . import cli, distributed, engine, loaders
from .batches import sample_count
from .distributed import DistEnv
from .errors import UserError, out_of_memory_is_a_user_error
from .logs import LoaderWatch, LossLog, TrackerBase
from .preemption import Diverged, EpochProgress, Stopped, StopRequest
from .seam import Task
from .state import Schedule, TrainingState

log = logging.getLogger(__name__)

# fit() copies each batch with paddle.to_tensor(), which warns about it.
warnings.filterwarnings("ignore", "To copy construct from a tensor")


@dataclass
class Trainable:
    """The network made trainable: `model` is what is validated and saved (the network itself), `fitted` the
    paddle.Model that trains it; `amp_dtype` ("fp16" or None) the run's mixed precision."""

    model: paddle.nn.Layer
    optimizer: paddle.optimizer.Optimizer
    schedule: Schedule
    scaler: None
    amp_dtype: str | None
    fitted: paddle.Model


def prepare(network: paddle.nn.Layer, train_loader: DataLoader, env: DistEnv, task: Task, args) -> Trainable:
    if args.strategy != "ddp":  # the basic loop's: fit() wraps the network in a DataParallel of its own
        raise UserError(
            "--strategy sharding: paddle.Model.fit() trains in its own DataParallel, which does not shard; a "
            "project baked with paddle_api=basic shards (or drop --strategy)",
            shown=env.local_rank == 0,
        )
    fitted = paddle_model(network, train_loader, task, args.compile, args.channels_last, args.activation_checkpointing)
    engine.seed_everything(args.seed + env.rank)  # then each rank its own random stream
    optimizer = task.optimizer(network, cli.DEFAULT_LR if args.lr is None else args.lr)
    clip_gradients(optimizer, args.clip_grad_norm)
    schedule = engine.cosine_schedule(optimizer, args.epochs)
    # paddle.Model's mixed precision is float16 only (its amp_configs take no dtype).
    amp_dtype = "fp16" if engine.mixed_precision(args.amp, args.amp_dtype, env) else None
    if amp_dtype and args.amp_dtype == "bf16":
        log.warning("--amp-dtype bf16: paddle.Model's mixed precision is float16 only, so this run uses float16")
    return Trainable(network, optimizer, schedule, None, amp_dtype, fitted)


def run_epochs(
    trained: Trainable, train_loader: DataLoader, val_loader: DataLoader, env: DistEnv, state: TrainingState,
    stop: StopRequest, task: Task, args, saves, tracker: TrackerBase, metrics, watch: LoaderWatch,
) -> None:  # fmt: skip
    """fit() over the epochs after the state's (none once --patience stopped the run); after each, as in the basic
    loop: validation (the weights --ema averages, if any), `metrics` and `tracker`, the Checkpointer `saves`, a vote
    on a stop."""
    fitted = trained.fitted
    # (After the resume: the accumulation steps may be the checkpoint's.)
    amp_configs = "O1" if trained.amp_dtype else None
    fitted.prepare(trained.optimizer, accumulated_loss(args.grad_accum), amp_configs=amp_configs)

    def end_epoch(epoch: int, train_stats: dict, started: float) -> None:
        """After fit's training steps and its learning-rate step: the rest of the basic loop's epoch."""
        with saves.ema.swapped():  # validation, and so best.*, --patience and --keep-best: the averaged weights
            val_stats = engine.evaluate(trained.model, val_loader, env, task, trained.amp_dtype)
        tracker.epoch(epoch, metrics.report(epoch, train_stats, val_stats, started))
        saves.end_epoch(epoch, val_stats, args.min_delta)
        stop.after_epoch(env, epoch, args.epochs)
        fitted.stop_training = epoch < args.epochs and state.stops_early(args.patience)  # fit ends after this epoch

    if state.epochs_done >= args.epochs or state.stops_early(args.patience):  # (a rerun of a stopped run too)
        return
    epoch_end = EpochEnd(
        train_loader, env, state, stop, end_epoch, args.grad_accum, args.log_every, tracker, watch, saves=saves,
        schedule=trained.schedule, ema=saves.ema,
    )  # fmt: skip
    # (paddle raises out of memory, on a GPU or in RAM, as a MemoryError; engine.evaluate() says so too)
    out_of_memory_is_a_user_error(MemoryError)(fitted.fit)(
        epoch_end.batches, epochs=args.epochs - state.epochs_done, verbose=0,  # EpochEnd logs instead
        accumulate_grad_batches=args.grad_accum, callbacks=[schedule_left_to_epoch_end(), epoch_end],
    )  # fmt: skip


class TaskLoss(paddle.nn.Layer):
    """The network with task.training_loss() on top, for fit(): forward() takes a flattened batch (`structure`:
    one batch as the loader makes it) and returns the task's loss."""

    def __init__(self, network: paddle.nn.Layer, structure, task: Task):
        super().__init__()
        self.network, self.structure, self.task = network, structure, task

    def forward(self, *flat):
        return self.task.training_loss(self.network, paddle.utils.pack_sequence_as(self.structure, list(flat)))


def paddle_model(
    network: paddle.nn.Layer, loader: DataLoader, task: Task, compile: bool = False, channels_last: bool = False,
    activation_checkpointing: bool = False,
) -> paddle.Model:  # fmt: skip
    """paddle.Model around the network and the task's loss, for the batches of `loader` (--compile,
    --channels-last and --activation-checkpointing are PyTorch's: the log says so).

    On several ranks it wraps the network in DataParallel itself, calling init_parallel_env()
    again (distributed.setup() has joined: paddle keeps that process group).
    """
    # The package's own helper, as wrap_model() uses it.
    distributed._say_pytorch_only(compile, channels_last, activation_checkpointing)
    structure = loader.collate_fn([loader.dataset[0]])
    sample_count(structure)  # (an error of the data's code stops here)
    inputs = [InputSpec([None], name=f"batch_{index}") for index in range(len(paddle.utils.flatten(structure)))]
    with distributed._without_flag_table():
        return paddle.Model(TaskLoss(network, structure, task), inputs=inputs, labels=[])


def schedule_left_to_epoch_end() -> paddle.callbacks.LRScheduler:
    """fit's own schedule callback, stepping nothing (without it fit adds one that steps every batch): EpochEnd
    advances the schedule after every optimizer step, as the basic loop does."""
    return paddle.callbacks.LRScheduler(by_step=False, by_epoch=False)


def clip_gradients(optimizer: paddle.optimizer.Optimizer, max_norm: float | None) -> None:
    """--clip-grad-norm for fit(), which steps the optimizer itself: the optimizer's own clipping, by the global
    norm (the basic loop clips before its step; max_norm None: as build_optimizer() made it)."""
    if max_norm is not None:
        optimizer._grad_clip = paddle.nn.ClipGradByGlobalNorm(max_norm)  # where its grad_clip argument goes


def accumulated_loss(grad_accum: int):
    """The loss for Model.prepare(): TaskLoss's output, task.training_loss().

    fit() sums the gradients of --grad-accum micro-batches; each loss divided by
    their number makes the sum a mean, as one big batch (and the basic loop) gives.
    """
    return lambda loss: loss / grad_accum


class CountedBatches:
    """The training loader as fit() reads it (EpochEnd's `batches`): each batch counted on its way as the basic loop
    counts it (batches.sample_count(); fit's own count is the first dimension of the batch's first array)."""

    def __init__(self, loader: DataLoader):
        self.loader, self.count = loader, 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.count = sample_count(batch)  # (an error of the data's code, raised in the loader, stops here)
            yield batch


class EpochEnd(paddle.callbacks.Callback):
    """A fit() callback: per-epoch shuffle and loss lines, then end_epoch(epoch, train_stats, started) on every rank.

    train_stats holds the mean loss, the distinct samples seen by all ranks and the learning rate
    the epoch trained with, as the basic loop's train_one_epoch() returns them. fit() counts its
    epochs from 0; the epochs here continue `state`: epochs_done + 1, ..., the first of them after
    `state.progress.consumed` samples of its order when a stopped epoch goes on. `saves` (the Checkpointer)
    writes the mid-epoch checkpoints of --save-every-steps; `schedule` (engine.cosine_schedule()'s) and `ema`
    (engine.Ema, --ema) are advanced after every optimizer step.
    """

    def __init__(
        self, loader: DataLoader, env: DistEnv, state: TrainingState, stop: StopRequest, end_epoch,
        grad_accum: int = 1, log_every: int | None = None, tracker: TrackerBase | None = None, watch: LoaderWatch | None = None,
        saves=None, schedule: Schedule | None = None, ema: engine.Ema | None = None,
    ):  # fmt: skip
        super().__init__()
        self.loader, self.env, self.stop, self.end_epoch, self.saves = loader, env, stop, end_epoch, saves
        self.schedule, self.ema = schedule, ema
        self.first_epoch, self.progress = state.epochs_done, replace(state.progress)
        self.grad_accum, self.log_every, self.tracker = grad_accum, log_every, tracker
        # fit() reads the batches itself: the wait for one is the time from the end of a step to the next begin.
        self.watch = watch or LoaderWatch(workers=0, loader_cores=0, is_main=False)
        self.batches = CountedBatches(loader)  # what fit() reads

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.epoch = self.first_epoch + epoch + 1
        self.started = time.perf_counter()
        sampler = loaders.train_sampler(self.loader)
        sampler.set_epoch(self.epoch)  # a new shuffle every epoch, the same on every rank
        sampler.consumed = self.progress.consumed  # fit() starts iterating right after this
        self.first_step = self.progress.step = self.progress.batches_done(sampler.batch_size, self.env.world_size)
        self.steps = self.first_step + len(self.loader)
        self.loss_log = LossLog(self.env.is_main, self.epoch, self.steps, self.grad_accum, self.log_every, self.tracker)
        self.lr = engine.epoch_rate(self.model._optimizer, self.schedule, self.epoch)  # (where fit keeps it)
        self.watch.start_epoch()
        self.step_ended = (time.perf_counter(), time.thread_time())

    def on_train_batch_begin(self, step: int, logs=None) -> None:
        ended, ended_cpu = self.step_ended
        self.watch.waited(time.perf_counter() - ended, time.thread_time() - ended_cpu)

    def on_train_batch_end(self, step: int, logs=None) -> None:
        batch = self.batches.count
        # fit reports the loss of accumulated_loss(), divided by --grad-accum: undo that.
        progress = self.progress
        progress.loss_sum += logs["loss"][0] * self.grad_accum * batch
        progress.seen += batch
        progress.step += 1
        self.loss_log.step(progress.step, progress.loss_sum, progress.seen)
        stepped = (progress.step - self.first_step) % self.grad_accum == 0  # fit() steps every --grad-accum batches
        if stepped or progress.step == self.steps:  # an optimizer step
            if self.schedule is not None:
                self.schedule.advance(self.epoch - 1 + progress.step / self.steps)
            if self.ema is not None:
                self.ema.update()
        # The last step needs no check.
        if stepped and progress.step < self.steps:
            sampler = loaders.train_sampler(self.loader)
            progress.consumed = sampler.consumed_after(progress.step - self.first_step)
            if self.stop.stop_now(self.env, loss_sum=progress.loss_sum, where=(self.epoch, progress.step)):
                raise Stopped(self.epoch, progress)
            if self.saves is not None and self.saves.due((progress.step - self.first_step) // self.grad_accum):
                self.saves.save_progress(replace(progress))
        self.step_ended = (time.perf_counter(), time.thread_time())

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        total_loss, total_seen = distributed.all_reduce_sum([self.progress.loss_sum, self.progress.seen], self.env)
        if not math.isfinite(total_loss):  # a loss since the last vote; the same sum, the same verdict everywhere
            raise Diverged(self.epoch, self.steps, shown=self.env.local_rank == 0)
        # The sampler repeats a few samples so every rank gets as many; they are not distinct.
        samples = int(total_seen) - loaders.train_sampler(self.loader).padding
        self.progress = EpochProgress()
        stats = {"loss": total_loss / total_seen, "samples": samples, "lr": self.lr, "data_wait": self.watch.data_wait}
        self.end_epoch(self.epoch, stats, self.started)
