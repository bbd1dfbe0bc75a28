"""Where training stands, and the part of checkpointing that is the same for every framework.

Each framework's checkpoint.Checkpointer is a CheckpointerBase that reads and writes its own files; this base owns
the TrainingState: it decides which epoch is the best (by the metric and direction task.py states), keeps how far a
stopped epoch got, and makes every rank agree on where a resumed run starts.
"""

import logging
import math
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import distributed, options, output_folder, roll_call
from .errors import UserError, bytes_of, disk_full, no_space_line
from .preemption import EpochProgress

log = logging.getLogger(__name__)

# The best of the first versions' checkpoints (best_acc, before task.py named a metric): the accuracy, the higher.
FIRST_BEST = ("acc", "max")


class Schedule:
    """The learning rate over training, as a factor of the optimizer's rate and a closed form of where training
    stands (`position`, in epochs: 2.5 is half-way through the third): a rise from 0 over the first `warmup` epochs
    (--warmup-epochs), then a cosine from 1 to 0 at `epochs` (a resumed run with a larger --epochs follows the new
    horizon). The loops advance() it after every optimizer step; the framework's scheduler (`stepper`, whose rate
    is its base rate x factor()) sets the optimizer's rate from it."""

    def __init__(self, epochs: int, warmup: float = 0.0):
        self.epochs, self.warmup, self.position = epochs, warmup, 0.0
        self.stepper = None  # engine.cosine_schedule() sets it

    def factor(self, position: float | None = None) -> float:
        """At `position`, or where training stands."""
        position = self.position if position is None else position
        if position < self.warmup:
            return position / self.warmup
        span = self.epochs - self.warmup
        done = min((position - self.warmup) / span, 1.0) if span > 0 else 0.0  # (no cosine left: the full rate)
        return 0.5 * (1 + math.cos(math.pi * done))

    def advance(self, position: float) -> None:
        """After an optimizer step at `position`: the rate of the next step."""
        self.position = position
        self.stepper.step()


@dataclass
class TrainingState:
    """Epochs done, the best value so far of the metric that picks best.* (None: no finite one yet), and this rank's
    progress into the next epoch."""

    epochs_done: int = 0
    best_value: float | None = None
    progress: EpochProgress = field(default_factory=EpochProgress)
    global_batch_size: int | None = None  # --global-batch-size of the run: kept by a resume on another world size
    grad_accum: int = 1  # the accumulation steps the run trains with
    amp_dtype: str | None = None  # its mixed precision: "bf16", "fp16", or None (full)
    # The rate its schedule decays from (not compared: states at one point are equal whatever rate they were given).
    base_lr: float | None = field(default=None, compare=False)
    # task.BEST_METRIC (without val_) and BEST_MODE, "max" or "min"; by default the loss, which every metrics() has.
    best_metric: str = "loss"
    best_mode: str = "min"
    # Where the schedule stands, in epochs (None: at the epochs done, as the first versions' per-epoch schedule), and
    # its warmup (--warmup-epochs).
    position: float | None = field(default=None, compare=False)
    warmup_epochs: float = 0.0
    stale_epochs: int = 0  # epochs in a row whose best metric did not improve by more than --min-delta
    ema_decay: float | None = None  # --ema's (None: the weights are not averaged)
    given_lr: float | None = field(default=None, compare=False)  # the --lr that rate comes from (None: the default)

    def switch_precision(self, amp_dtype: str | None) -> None:
        """Train on in `amp_dtype`: what this device needs, which may differ from the resumed run's (said once)."""
        if self.epochs_done and amp_dtype != self.amp_dtype:
            log.info("the checkpoint trained in %s; this run trains in %s", self.amp_dtype or "full precision",
                     amp_dtype or "full precision")  # fmt: skip
        self.amp_dtype = amp_dtype

    def plan_batches(self, batch_size: int, world_size: int, grad_accum: int, global_batch_size: int | None) -> int:
        """The accumulation steps of this run: --grad-accum, or those that make the global batch G of --batch-size
        on `world_size` processes, G being --global-batch-size, or the one of the run this one resumes."""
        target = global_batch_size or self.global_batch_size
        steps = grad_accum
        if target is not None:
            per_step = batch_size * world_size
            if target % per_step:
                raise UserError(
                    f"--global-batch-size {target} is not a multiple of --batch-size {batch_size} x {world_size} "
                    f"process(es) = {per_step}: choose a global batch that is, or another --batch-size"
                )
            steps = target // per_step
            if global_batch_size and self.global_batch_size not in (None, global_batch_size):
                log.info(
                    "--global-batch-size %d replaces the resumed run's %d", global_batch_size, self.global_batch_size
                )
            elif self.global_batch_size and steps != self.grad_accum:
                log.info(
                    "global batch %d kept on %d process(es) of batch %d: %d accumulation steps (were %d)",
                    target, world_size, batch_size, steps, self.grad_accum,
                )  # fmt: skip
        self.global_batch_size, self.grad_accum = target, steps
        return steps

    def finish_epoch(self, epoch: int, metrics: dict, min_delta: float = 0.0) -> bool:
        """Record a finished epoch; True when its best metric is the best so far in its direction (ties keep the
        earlier best). A value that is not finite is never best, and is said. An epoch not better by more than
        `min_delta` is stale (--patience)."""
        value = metrics[self.best_metric]
        if not math.isfinite(value):
            log.info("val_%s is %s at epoch %d: not a number to compare, so not a best checkpoint", self.best_metric,
                     value, epoch)  # fmt: skip
            is_best = improved = False
        elif self.best_value is None:
            is_best = improved = True
        else:
            gain = value - self.best_value if self.best_mode == "max" else self.best_value - value
            is_best, improved = gain > 0, gain > min_delta
        if is_best:
            self.best_value = value
        self.stale_epochs = 0 if improved else self.stale_epochs + 1
        self.epochs_done, self.progress = epoch, EpochProgress()
        return is_best

    def stops_early(self, patience: int | None) -> bool:
        """Whether --patience ends training here (said): as many epochs in a row without improvement."""
        if not patience or self.stale_epochs < patience:
            return False
        log.info("stopped early after epoch %d: val_%s has not improved on its best, %s, for %d epoch%s (--patience "
                 "%d)", self.epochs_done, self.best_metric, f"{self.best_value:.6g}", self.stale_epochs,
                 "s" * (self.stale_epochs != 1), patience)  # fmt: skip
        return True

    def choose_best_by(self, metric: str, mode: str) -> None:
        """Pick best.* by task.py's metric and direction; a resumed run's best by another one does not count."""
        if (metric, mode) != (self.best_metric, self.best_mode) and self.best_value is not None:
            log.info("best.* was chosen by val_%s (%s) and is now chosen by val_%s (%s): the best so far starts afresh",
                     self.best_metric, self.best_mode, metric, mode)  # fmt: skip
            self.best_value, self.stale_epochs = None, 0
        self.best_metric, self.best_mode = metric, mode


class CheckpointerBase:
    """Save and resume the model, optimizer, schedule and scaler (None where the framework keeps its own).

    A framework's Checkpointer adds its files: _write() (rank 0; every rank where _sharded)
    and _read(), which loads the model, optimizer, schedule and scaler; _init_weights() for
    --init-from; and its random streams and schedule's rates (its base rate; the rate of the schedule's factor).
    `schedule` is engine.cosine_schedule()'s Schedule.
    """

    _sharded = False  # a framework's Checkpointer sets it where each rank saves its own shards
    _saves_in_background = False  # and this where those saves can be written while training goes on

    def __init__(
        self, directory: str | Path, env, model, optimizer, schedule: Schedule, scaler=None, data: dict | None = None,
        best: tuple[str, str] = ("loss", "min"),
    ):  # fmt: skip
        self.directory = Path(directory)
        self.env = env
        self.model, self.optimizer, self.schedule, self.scaler = model, optimizer, schedule, scaler
        self.data = data or {}  # seam.data_description(): saved with every checkpoint, for predictions
        self.best = best  # task.py's BEST_METRIC and BEST_MODE
        self.state = TrainingState(best_metric=best[0], best_mode=best[1])
        self.loaded: Path | None = None  # the checkpoint resume() read
        self.loaded_data: dict | None = None  # and the data description it kept
        self.every_steps: int | None = None  # --save-every-steps
        self.keep_best: int | None = None  # --keep-best
        self.evaluating = False  # --evaluate: the checkpoint read is evaluated, not resumed (nor said to be)
        self.in_background = False  # save_in_background()
        self.ema = None  # the framework's engine.Ema (--ema)

    def save_in_background(self, asked: bool | None) -> None:
        """--save-async: saves written while training goes on (None: where each rank saves its shards)."""
        self.in_background = self._saves_in_background if asked is None else asked and self._saves_in_background
        if asked and not self._saves_in_background:
            log.info("--save-async: only a sharded model's saves (PyTorch's --strategy fsdp, hsdp) are written in the "
                     "background; this run writes its checkpoints before training goes on")  # fmt: skip

    def wait_for_save(self) -> None:
        """Until a background save has been written (at the next save, a stop and the end of the run): its error,
        a full disk as one line, is raised here."""
        self._wait_for_save()

    def _wait_for_save(self) -> None: ...  # a framework's Checkpointer that saves in the background waits here

    def due(self, optimizer_step: int) -> bool:
        """Whether the epoch's `optimizer_step`-th optimizer step ends with a mid-epoch save (--save-every-steps)."""
        return bool(self.every_steps) and optimizer_step % self.every_steps == 0

    def save_progress(self, progress: EpochProgress) -> None:
        """Save how far the epoch got (a mid-epoch last.*, as a stop writes it); on every rank."""
        self._save(replace(self.state, progress=progress), is_best=False, kept=None)

    def end_epoch(self, epoch: int, metrics: dict, min_delta: float = 0.0) -> None:
        """Record a finished epoch (its validation metrics, without val_) and save it (last, best when it is the
        best, and kept while it is among the --keep-best best); on every rank."""
        is_best = self.state.finish_epoch(epoch, metrics, min_delta)
        output_folder.carry_best(self.loaded, self.directory, self.env.is_main and not is_best, self.wait_for_save)
        kept = output_folder.Kept(epoch, metrics[self.state.best_metric], self.keep_best or 0, self.state.best_mode)
        among_best = (
            bool(self.keep_best) and math.isfinite(kept.value) and output_folder.enters_top(self.directory, kept)
        )
        self._save(self.state, is_best, kept if among_best else None)

    def save_stopped(self, stopped) -> None:
        """Save how far a stopped epoch got (a preemption.Stopped), on every rank; at an epoch's end it is saved."""
        if stopped.progress.step:
            self.save_progress(stopped.progress)

    def resume(
        self, how: str, init_from: str | None = None, lr: float | None = None, warmup_epochs: float | None = None
    ) -> TrainingState:
        """Load the checkpoint `how` names (auto, none or a path) and return where training stands.

        Every rank loads it, and all must find the same point: a machine that cannot see the checkpoint would
        otherwise start afresh and train a different model. A fresh start begins from the weights of `init_from`
        (--init-from), where they fit the model. A resumed run keeps its learning rate, or, given `lr` (--lr), trains
        at it from there on, the schedule continuing from it; likewise with `warmup_epochs` (--warmup-epochs).
        """
        built = self._base_lr()  # build_optimizer()'s rate for this start's --lr (a task's optimizer may take a share)
        loaded = self._read(how)
        self.state = TrainingState() if loaded is None else self._restored(*loaded)
        self.state.choose_best_by(*self.best)
        self.loaded, self.loaded_data = (loaded[0], loaded[1].get("data")) if loaded is not None else (None, None)
        if init_from and loaded is not None:
            log.info("--init-from %s ignored: a resumed run goes on from its own checkpoint", init_from)
        elif init_from:
            if not Path(init_from).exists():
                raise UserError(
                    f"--init-from {init_from} not found: pass a file of weights (a state dict or a checkpoint), or a "
                    "sharded save's folder"
                )
            self._init_weights(Path(init_from))
        self._place_ema(loaded is not None)
        points = distributed.all_gather_object((self.state.epochs_done, self.state.progress.step))
        if len(set(points)) > 1:
            raise UserError(
                f"ranks found checkpoints of different epochs ({[epoch for epoch, _ in points]}) in {self.directory}: "
                "give every machine the same --output-dir on a shared filesystem, or copy the checkpoints to each"
            )
        self._place_schedule(loaded is not None, warmup_epochs)
        if loaded is not None and self.state.base_lr is not None:
            self._set_base_lr(self.state.base_lr)  # the run's own, not build_optimizer()'s default
        saved = loaded[1] if loaded is not None else {"given_lr": lr}  # (a fresh start: its own --lr)
        # A --lr given again is the run's own: as its checkpoint records (1.3.10's: as its config.yaml, a start's).
        before = saved["given_lr"] if "given_lr" in saved else options.last_start(self.directory.parent).get("lr")
        if loaded is not None and lr not in (None, before):
            factor = self.schedule.factor()
            log.info("--lr %g: the resumed run trains at it from epoch %d on (the optimizer's rate %g, was %g), the "
                     "schedule going on from it", lr, self.state.epochs_done + 1, built, self._base_lr() * factor)  # fmt: skip
            self._set_base_lr(built / factor if factor > 0 else built)
        self.state.base_lr, self.state.given_lr = self._base_lr(), before if lr is None else lr
        self._reapply_schedule()
        return self.state

    def _place_schedule(self, resumed: bool, warmup_epochs: float | None) -> None:
        """The schedule where the resumed run left it (a checkpoint of the first versions: at its epochs done), with
        its warmup, or the one given (said when it differs)."""
        schedule, state = self.schedule, self.state
        schedule.position = state.epochs_done if state.position is None else state.position
        if warmup_epochs is not None:
            if resumed and warmup_epochs != state.warmup_epochs:
                log.info("--warmup-epochs %g replaces the resumed run's %g", warmup_epochs, state.warmup_epochs)
            state.warmup_epochs = warmup_epochs
        schedule.warmup = state.warmup_epochs

    def _place_ema(self, resumed: bool) -> None:
        """--ema's decay: the one given, else the resumed run's (said either way); the average starts at the weights
        where the checkpoint holds none (said)."""
        ema, saved = self.ema, self.state.ema_decay
        if ema is None:
            return
        if saved is not None and ema.decay != saved:
            given = "this run goes on with" if ema.decay is None else f"--ema {ema.decay:g} replaces"
            log.info("%s the resumed run's --ema %g", given, saved)
        ema.decay = self.state.ema_decay = saved if ema.decay is None else ema.decay
        if ema.decay is not None and not ema.active:
            if resumed:
                log.info("--ema: the checkpoint holds no averaged weights; the average starts at its weights")
            ema.start()

    def _fitting(self, own: dict, given: dict, path: Path) -> dict:
        """The tensors of `given` that fit the model's (`own`: same name, same shape); the others are listed."""
        fitting = {name: value for name, value in given.items() if name in own and _shape(value) == _shape(own[name])}
        if not fitting:
            raise UserError(
                f"--init-from {path}: none of its {len(given)} tensors fits build_model()'s names and shapes "
                "(weights of another network?)"
            )
        left = [
            f"{name} ({_shape(given[name])} in the file, {_shape(value)} in the model)" if name in given else name
            for name, value in own.items()
            if name not in fitting
        ]
        log.info("initialised from %s: %d of the model's %d tensors", path, len(own) - len(left), len(own))
        if left:
            log.info("left as build_model() made them (not in the file, or of another shape): %s", ", ".join(left))
        return fitting

    def _save(self, state: TrainingState, is_best: bool, kept: output_folder.Kept | None) -> None:
        # Every rank's random streams and progress are gathered; only rank 0 writes (every rank its shards).
        per_rank = distributed.all_gather_object((self._capture_rng(), state.progress.to_dict()))
        problem = None
        if self.env.is_main or self._sharded:
            training = {
                "epoch": state.epochs_done,
                "best_metric": state.best_metric,
                "best_mode": state.best_mode,
                "best_value": state.best_value,
                "rng": [rng for rng, _ in per_rank],
                "progress": [progress for _, progress in per_rank],
                "data": self.data,
                "global_batch_size": state.global_batch_size,
                "grad_accum": state.grad_accum,
                "amp_dtype": state.amp_dtype,
                "base_lr": state.base_lr,
                "given_lr": state.given_lr,
                "position": self.schedule.position,
                "warmup_epochs": state.warmup_epochs,
                "stale_epochs": state.stale_epochs,
                "ema_decay": state.ema_decay,
            }
            problem = self._write_unless_disk_full(training, is_best, kept)
        # The others wait here, not at the next step's collective: a long save must not run into its timeout.
        problem = distributed.share_from_main(problem, "rank 0's checkpoint save")
        if problem:
            raise UserError(problem, shown=self.env.local_rank == 0)

    def _write_unless_disk_full(self, training: dict, is_best: bool, kept) -> str | None:
        """Write the checkpoint; or, where the disk is full, leave the last one as it was and say why."""
        try:
            self._write(training, is_best, kept)
            return None
        except Exception as error:
            if not self._out_of_space(error):
                raise
        return self._no_space()

    def _out_of_space(self, error: BaseException) -> bool:
        """Whether a save failed for want of room: a full disk said so, or a write failed (a torch.save() on a
        full disk can fail with a short write) and there is less room than a checkpoint needs."""
        return disk_full(error) or shutil.disk_usage(self.directory).free < self._bytes_needed()

    def _bytes_needed(self) -> int:
        """About the bytes of a checkpoint: the model's and the optimizer's tensors."""
        return bytes_of((distributed.unwrap(self.model).state_dict(), self.optimizer.state_dict()))

    def _no_space(self) -> str:
        return no_space_line(self.directory, self._bytes_needed())

    def _restored(self, path: Path, saved: dict) -> TrainingState:
        """Where the loaded checkpoint stands for this rank, its random streams restored."""
        saved_world = len(saved["rng"])
        if saved_world == self.env.world_size:
            self._restore_rng(saved["rng"][self.env.rank])
            progress = EpochProgress(**saved["progress"][self.env.rank])
        else:
            progress = self._moved(saved["progress"])
        if saved["progress"][0]["step"] and "consumed" not in saved["progress"][0]:  # from before it was saved
            log.warning("the checkpoint does not say where its stopped epoch got to: the epoch starts again")
            progress = EpochProgress()
        if progress.step:
            where = f"{path} (epoch {saved['epoch'] + 1}, step {progress.step})"
        elif progress.consumed:
            where = f"{path} (epoch {saved['epoch'] + 1}, after its first {progress.consumed} samples)"
        else:
            where = f"{path} (epoch {saved['epoch']})"
        if roll_call.job_id():  # a restart of an elastic job, in one line
            log.info(roll_call.restart_line(saved_world, self.env.world_size, self.env.local_world_size, where))
        elif not self.evaluating:
            if saved_world != self.env.world_size:
                log.warning("world size changed from %d to %d: random streams start afresh", saved_world,
                            self.env.world_size)  # fmt: skip
            log.info("resumed from %s", where)
        return self._state_of(saved, progress)

    @staticmethod
    def _state_of(saved: dict, progress: EpochProgress) -> TrainingState:
        best_value = saved["best_value"] if "best_metric" in saved else saved[f"best_{FIRST_BEST[0]}"]
        return TrainingState(
            saved["epoch"], best_value, progress,
            saved.get("global_batch_size"), saved.get("grad_accum", 1), saved.get("amp_dtype"), saved.get("base_lr"),
            saved.get("best_metric", FIRST_BEST[0]), saved.get("best_mode", FIRST_BEST[1]), saved.get("position"),
            saved.get("warmup_epochs", 0.0), saved.get("stale_epochs", 0), saved.get("ema_decay"),
        )  # fmt: skip

    def _moved(self, saved: list[dict]) -> EpochProgress:
        """A stopped epoch's progress, saved by another number of ranks, on this one: it goes on from the same
        place in the epoch's order (each rank from its first batch again); rank 0 carries the loss and samples
        so far, so the epoch's mean loss is the same."""
        progress = EpochProgress(consumed=saved[0].get("consumed", 0))
        if self.env.is_main:
            progress.loss_sum, progress.seen = sum(p["loss_sum"] for p in saved), sum(p["seen"] for p in saved)
        return progress


def _shape(tensor) -> tuple[int, ...]:
    return tuple(int(size) for size in tensor.shape)
