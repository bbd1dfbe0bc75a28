"""The training and evaluation loops.

paddle raises its ResourceExhaustedError (out of memory, on a GPU or in RAM) as a MemoryError.

Per step there is no host synchronisation: the running loss stays on the
device and is read every --log-every steps only.
"""

import contextlib
import logging
import math
import os
import random
import re
from collections.abc import Callable

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.base import core
from paddle.io import DataLoader

from . import distributed, hardware, loaders, roll_call, sharding
from .batches import sample_count
from .distributed import DistEnv
from .errors import UserError, out_of_memory_is_a_user_error
from .logs import LoaderWatch, LossLog, TrackerBase, progress_bar
from .preemption import Diverged, EpochProgress, Stopped, StopRequest
from .seam import Task
from .state import Schedule

log = logging.getLogger(__name__)


@out_of_memory_is_a_user_error(MemoryError)
def train_one_epoch(
    model, loader: DataLoader, optimizer, scaler, env: DistEnv, epoch: int, progress: EpochProgress,
    stop: StopRequest, task: Task, grad_accum: int = 1, log_every: int | None = None, tracker: TrackerBase | None = None,
    watch: LoaderWatch | None = None, amp_dtype: str | None = None, clip_grad_norm: float | None = None,
    saves=None, schedule: Schedule | None = None, ema: "Ema | None" = None,
) -> dict:  # fmt: skip
    """One pass over this rank's shard: the mean loss, the distinct samples seen by all ranks, the learning rate,
    the part of the pass spent waiting for batches (`watch` times them, and says once when workers would help).

    The pass starts after `progress.consumed` samples of the epoch's order (non-zero when a stopped epoch goes
    on). When `stop` asks for it, the pass ends after an optimizer step by raising Stopped, which says where;
    else `saves` (the Checkpointer) may save a mid-epoch checkpoint there (--save-every-steps).
    `clip_grad_norm`: the gradients' largest global norm (--clip-grad-norm; None: not clipped).
    Every `log_every` batches, rank 0 logs the epoch's mean loss so far, and gives it to `tracker` (logs.LossLog).
    `amp_dtype` ("bf16", "fp16", None) is mixed_precision()'s; float16 needs `scaler` enabled.
    `schedule` (cosine_schedule()'s) sets the rate after every optimizer step; "lr" is the rate the pass began at.
    `ema` (--ema) averages the weights after every optimizer step.
    """
    model.train()
    sampler = loaders.train_sampler(loader)
    sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
    sampler.consumed = progress.consumed
    lr = epoch_rate(optimizer, schedule, epoch)
    loss_sum = paddle.to_tensor(progress.loss_sum, dtype="float32")
    seen = progress.seen
    start = progress.batches_done(sampler.batch_size, env.world_size)
    steps = start + len(loader)
    loss_log = LossLog(env.is_main, epoch, steps, grad_accum, log_every, tracker)
    watch = watch or LoaderWatch(workers=0, loader_cores=0, is_main=False)
    clip_here = clip_grad_norm is not None and not sharding.clips_in_step(optimizer, clip_grad_norm)
    batches = progress_bar(watch.batches(loader), env.is_main, f"epoch {epoch}", total=len(loader))
    step = start
    # A rank that stopped answering: the error names the epoch and the step the others waited in.
    with collective_timeouts(lambda: f"epoch {epoch} step {step}/{steps}", env):
        for step, batch in enumerate(batches, start + 1):
            count = sample_count(batch)  # (an error of the data's code, raised in the loader, stops here)
            batch = loaders.to_device(batch, env.device)
            # Counted from the pass's start (a stop's step, a whole number of the accumulation of the run it stopped).
            steps_now = (step - start) % grad_accum == 0 or step == steps
            # Gradients are all-reduced only on the micro-batch that steps the optimizer (sharding's step reduces them).
            sync = model.no_sync() if not steps_now and hasattr(model, "no_sync") else contextlib.nullcontext()
            with sync:
                with _autocast(amp_dtype):
                    loss = task.training_loss(model, batch)
                scaler.scale(loss / grad_accum).backward()
            if steps_now:
                if clip_here:
                    scaler.unscale_(optimizer)  # the norm of the true gradients, not of the scaled ones
                    paddle.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.clear_grad()
                if schedule is not None:
                    schedule.advance(epoch - 1 + step / steps)
                if ema is not None:
                    ema.update()
            loss_sum += loss.detach().astype("float32").reshape([]) * count
            seen += count
            loss_log.step(step, loss_sum, seen)
            if steps_now and step < steps:  # the last step needs neither: the epoch's own save and vote follow it
                stopping = stop.stop_now(env, loss_sum=loss_sum, where=(epoch, step))
                if stopping or (saves is not None and saves.due((step - start) // grad_accum)):
                    here = EpochProgress(step, loss_sum.item(), seen, sampler.consumed_after(step - start))
                    if stopping:
                        raise Stopped(epoch, here)
                    saves.save_progress(here)
        total_loss, total_seen = distributed.all_reduce_sum([loss_sum.item(), seen], env)
    if not math.isfinite(total_loss):  # a loss since the last vote; the same sum, the same verdict everywhere
        raise Diverged(epoch, steps, shown=env.local_rank == 0)
    # The sampler repeats a few samples so every rank gets as many; they are not distinct.
    samples = int(total_seen) - sampler.padding
    return {"loss": total_loss / total_seen, "samples": samples, "lr": lr, "data_wait": watch.data_wait}


class Ema:
    """--ema DECAY: after every optimizer step, averages = DECAY * averages + (1 - DECAY) * weights, over the
    floating-point tensors of the model's state dict (its parameters, batch norm's statistics), kept in float32 (a
    decay near 1 makes each update too small for lower precisions). Under --strategy sharding stage 1 every rank
    holds the whole parameters and averages them. Before start() (a run without --ema) it holds nothing and does
    nothing."""

    def __init__(self, model, decay: float | None = None):
        self.wrapper, self.model, self.decay = model, distributed.unwrap(model), decay
        self.averages: dict[str, paddle.Tensor] = {}  # by state dict name

    @property
    def active(self) -> bool:
        return bool(self.averages)

    @paddle.no_grad()
    def start(self) -> None:
        """Begin the average at the model's weights."""
        if type(self.wrapper).__name__.startswith("GroupSharded"):  # group_sharded_parallel()'s, GPUs only
            raise UserError(
                "--ema under --sharding-stage 2 or 3 is not supported yet (those stages run on GPUs only, where it has "
                "not been tried): use --sharding-stage 1, under which every rank averages the whole parameters"
            )
        self.averages = {name: tensor.detach().astype("float32").clone() for name, tensor in self._weights().items()}

    @paddle.no_grad()
    def update(self) -> None:
        weights = self._weights() if self.averages else {}
        for name, average in self.averages.items():
            average.scale_(self.decay).add_(weights[name].astype("float32") * (1 - self.decay))

    @contextlib.contextmanager
    def swapped(self, wanted: bool = True):
        """The averages in the model's own tensors, in place, for the block (validation); then its weights again."""
        if not (wanted and self.averages):
            yield
            return
        weights = self._weights()
        with paddle.no_grad():
            kept = {name: weights[name].clone() for name in self.averages}
            for name, average in self.averages.items():
                paddle.assign(average.astype(weights[name].dtype), output=weights[name])
        try:
            yield
        finally:
            with paddle.no_grad():
                for name, own in kept.items():
                    paddle.assign(own, output=weights[name])

    @paddle.no_grad()
    def load(self, saved: dict) -> None:
        """Go on from a checkpoint's averages, by name."""
        self.start()
        for name, average in self.averages.items():
            paddle.assign(saved[name], output=average)

    def _weights(self) -> dict[str, paddle.Tensor]:
        return {name: tensor for name, tensor in self.model.state_dict().items() if paddle.is_floating_point(tensor)}


@contextlib.contextmanager
def collective_timeouts(where: str | Callable[[], str], env: DistEnv):
    """A collective of the block that gives up because a rank stopped answering ends this rank in roll_call's
    one error line: `where` (the epoch and step; a callable is asked then, as a loop's step changes), and the
    ranks that stopped answering.

    On CPUs paddle's gloo gives up after its fixed 30 s, whatever --dist-timeout says (PADDLE_PG_TIMEOUT is
    NCCL's). Where it gives up in a Python call (a vote, an evaluation, a save) it raises RuntimeError; in the
    gradients' all-reduce inside backward() it ends the process in C++ (std::terminate, SIGABRT): launcher.py
    says that in one line instead.
    """
    try:
        yield
    except RuntimeError as error:
        if env.world_size == 1 or not re.search("timeout|timed out", str(error), re.IGNORECASE):
            raise
        if env.on_gpu:
            limit = f"--dist-timeout {int(os.environ['PADDLE_PG_TIMEOUT']) / 1000:g} s"  # as setup() set it
            remedy = "raise --dist-timeout if a rank may rightly take longer"
        else:
            limit = f"paddle's {distributed._GLOO_LIMIT_S} s"
            remedy = "on CPUs paddle gives up after gloo's fixed limit, whatever --dist-timeout says"
        add = core.create_or_get_global_tcp_store().add  # the store init_parallel_env() met at
        place = where() if callable(where) else where
        raise roll_call.explained(place, limit, remedy, env.rank, env.world_size, add) from None


def evaluate(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None = None) -> dict:
    """task.metrics() over the whole validation set, and its size ("samples")."""
    size = loader.batch_sampler.dataset_size
    return {**task.metrics(_validated(model, loader, env, task, amp_dtype), size), "samples": size}


def out_of_fold(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None = None) -> list:
    """Every validation batch's (number, sums, per-sample values, predict_step()'s rows), from every rank: a
    fold's out-of-fold predictions and what cv.py pools."""
    return _validated(model, loader, env, task, amp_dtype, rows=True)


@out_of_memory_is_a_user_error(MemoryError)
@paddle.no_grad()
def _validated(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None, rows: bool = False) -> list:
    """Every validation batch's (number, sums, per-sample values[, rows]), from every rank, in the training's
    precision. The loader deals whole batches to the ranks (loaders.DealtBatches): each batch is the same
    whatever the number of processes, each sample counted once."""
    # The unwrapped model: ranks run different numbers of batches, and only training needs the wrapper.
    model = distributed.unwrap(model)
    _rank_0s_buffers(model, env)
    model.eval()
    dealt = loader.batch_sampler
    mine = [
        _contribution(model, batch, number, dealt, env, task, amp_dtype, rows)
        for number, batch in zip(dealt.numbers, loader, strict=True)
    ]
    # One collective after the loop (ranks have different numbers of batches): every rank gets every batch's part.
    return [part for rank in distributed.all_gather_object(mine) for part in rank]


@out_of_memory_is_a_user_error(MemoryError)
@paddle.no_grad()
def check_task(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None = None) -> None:
    """task.validation_step() and metrics() on this rank's first and last validation batches, before training: a
    metric they miss, or a batch they cannot read, ends the run now in one line (training_loss() meets its first
    batch at the first step); two batches, mostly of different sizes, so that metrics() meets per-sample values
    padded as batches of different shapes make them (seam.padded()). The batches are made here, not by the loader,
    whose workers keep their place."""
    dealt = loader.batch_sampler
    if not dealt.numbers:
        return
    model = distributed.unwrap(model)
    model.eval()
    numbers = sorted({dealt.numbers[0], dealt.numbers[-1]})
    parts = [_contribution(model, _batch(loader, number), number, dealt, env, task, amp_dtype) for number in numbers]
    task.metrics(parts, sum(map(dealt.size_of, numbers)))


def _batch(loader: DataLoader, number: int):
    """Validation batch `number`, made here: the loader's workers keep their place."""
    return loader.collate_fn([loader.dataset[index] for index in loader.batch_sampler.indices(number)])


def _rank_0s_buffers(model, env: DistEnv) -> None:
    """Rank 0's buffers on every rank: batch norm's running statistics, which each rank's own batches moved, while
    the checkpoint keeps rank 0's; so every rank evaluates the model that is saved. Paddle keeps them as
    parameters that take no gradient, not as buffers."""
    if env.world_size > 1:
        for tensor in [*model.buffers(), *(parameter for parameter in model.parameters() if parameter.stop_gradient)]:
            dist.broadcast(tensor, src=0)


def _contribution(
    model, batch, number: int, dealt, env: DistEnv, task: Task, amp_dtype: str | None, rows: bool = False
) -> tuple:
    """Batch `number`'s (number, sums, per-sample values) from task.validation_step(), in numpy; and its rows of
    predict_step() where asked for."""
    sample_count(batch)  # (an error of the data's code, raised in the loader, stops here)
    batch = loaders.to_device(batch, env.device)
    with _autocast(amp_dtype):
        sums, per_sample = task.validation_step(model, batch, dealt.size_of(number), _numpy)
        return (number, sums, per_sample, task.validation_rows(model, batch)) if rows else (number, sums, per_sample)


def _numpy(value) -> np.ndarray:
    return value.numpy() if isinstance(value, paddle.Tensor) else np.asarray(value)


def training_memory(model, optimizer) -> tuple[int, int]:
    """The model's parameters, and the bytes this process holds for them: its parameters, their gradients and
    the optimizer's state (as many tensors per parameter as this optimizer keeps: 1 for Momentum, 2 for Adam;
    counted on a small parameter of its own, as its state is made at the first step) for the parameters whose
    state it keeps (under sharding: its part)."""
    parameters, own = list(model.parameters()), sharding.innermost(optimizer)
    size = lambda tensors: sum(tensor.numel().item() * tensor.element_size() for tensor in tensors)  # noqa: E731
    held = 2 * size(parameters) + size(own._parameter_list) * _state_per_parameter(own)
    return sum(parameter.numel().item() for parameter in parameters), held


def _state_per_parameter(optimizer) -> int:
    """The tensors of a parameter's size the optimizer keeps, tried on a probe of its own (0 for one that cannot
    be tried so: the log line is an estimate, never a reason to stop)."""
    try:
        # Filled with a constant: a random fill would draw from the stream that a resumed run has just restored.
        probe = paddle.create_parameter([3, 5], "float32", default_initializer=paddle.nn.initializer.Constant(1.0))
        trial = type(optimizer)(parameters=[probe])
        (probe * probe).sum().backward()
        trial.step()
    except Exception:
        return 0
    kept = trial.state_dict().values()
    return sum(isinstance(value, paddle.Tensor) and list(value.shape) == [3, 5] for value in kept)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def whole_on_rank0_only(env: DistEnv, strategy: str, init_from: str | None):
    """Where build_model() makes the network's tensors: on every rank, whole (PyTorch's FSDP makes them on rank 0
    alone under --init-from)."""
    return contextlib.nullcontext()


def names_as_in_a_new_process():
    """A context for one model's run among several in a process (--fold all): Paddle names parameters and
    optimizer states by a count through the process, and a checkpoint is read back by those names, so each run
    counts from 0, as a process of its own does (a fold resumed alone reads the states a fold-all run saved)."""
    return paddle.utils.unique_name.guard()


def epoch_rate(optimizer, schedule: Schedule | None, epoch: int) -> float:
    """The rate `epoch` begins at (a pass resumed within it began later), or the optimizer's without a schedule."""
    return optimizer.get_lr() if schedule is None else schedule.stepper.base_lr * schedule.factor(epoch - 1)


def cosine_schedule(optimizer, epochs: int, warmup_epochs: float = 0.0) -> Schedule:
    """The optimizer's learning rate over `epochs`: a rise over `warmup_epochs`, then a cosine decay towards 0
    (state.Schedule), set after every optimizer step by a LambdaDecay of the schedule's factor. It is attached to
    the optimizer, which saves it with its own state."""
    schedule = Schedule(epochs, warmup_epochs)
    schedule.stepper = paddle.optimizer.lr.LambdaDecay(optimizer.get_lr(), lambda _: schedule.factor())
    optimizer.set_lr_scheduler(schedule.stepper)
    return schedule


def grad_scaler(amp_dtype: str | None) -> paddle.amp.GradScaler:
    """Loss scaling, which float16 needs (bfloat16 has float32's range); a pass-through otherwise."""
    return paddle.amp.GradScaler(enable=amp_dtype == "fp16")


def mixed_precision(amp: bool, asked: str, env: DistEnv) -> str | None:
    """This run's autocast dtype on this rank's GPU, by hardware.amp_dtype()'s rule ("bf16", "fp16"; None: full
    precision; paddle uses TF32 on GPUs that have it by default, FLAGS_allow_tf32_cublas)."""
    gpu = int(env.device.split(":")[1]) if env.on_gpu else None
    capability = paddle.device.cuda.get_device_capability(gpu) if env.on_gpu else None
    return hardware.amp_dtype(amp, asked, capability)


def _autocast(amp_dtype: str | None):
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(amp_dtype, "float16")
    return paddle.amp.auto_cast(enable=amp_dtype is not None, dtype=dtype)


def configure_kernels(deterministic: bool) -> None:
    """cuDNN's exhaustive algorithm search (autotuning), or with --deterministic deterministic cuDNN kernels
    only; flags of paddle's CUDA build (a CPU build has neither, nor needs them)."""
    if paddle.device.is_compiled_with_cuda():
        paddle.set_flags(
            {"FLAGS_cudnn_deterministic": deterministic, "FLAGS_cudnn_exhaustive_search": not deterministic}
        )
