"""The training and evaluation loops.

Per step there is no host synchronisation: the running loss stays on the
device and is read every --log-every steps only.
"""

import contextlib
import inspect
import logging
import math
import os
import random
import re
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.data import DataLoader

from . import distributed, fsdp, hardware, loaders, roll_call
from .batches import sample_count
from .distributed import DistEnv
from .errors import out_of_memory_is_a_user_error
from .logs import LoaderWatch, LossLog, TrackerBase, progress_bar
from .preemption import Diverged, EpochProgress, Stopped, StopRequest
from .seam import Task
from .state import Schedule

log = logging.getLogger(__name__)


@out_of_memory_is_a_user_error(torch.OutOfMemoryError)
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
    loss_sum = torch.tensor(progress.loss_sum, device=env.device)
    seen = progress.seen
    start = progress.batches_done(sampler.batch_size, env.world_size)
    steps = start + len(loader)
    loss_log = LossLog(env.is_main, epoch, steps, grad_accum, log_every, tracker)
    watch = watch or LoaderWatch(workers=0, loader_cores=0, is_main=False)
    batches = progress_bar(watch.batches(loader), env.is_main, f"epoch {epoch}", total=len(loader))
    step = start
    # A rank that stopped answering: the error names the epoch and the step the others waited in.
    with collective_timeouts(lambda: f"epoch {epoch} step {step}/{steps}", env):
        for step, batch in enumerate(batches, start + 1):
            count = sample_count(batch)  # (an error of the data's code, raised in a loader worker, stops here)
            batch = loaders.to_device(batch, env.device)
            # Counted from the pass's start (a stop's step, a whole number of the accumulation of the run it stopped).
            steps_now = (step - start) % grad_accum == 0 or step == steps
            # Gradients are reduced only on the micro-batch that steps the optimizer.
            with _gradient_sync(model, steps_now):
                with _autocast(env, amp_dtype):
                    loss = task.training_loss(model, batch)
                scaler.scale(loss / grad_accum).backward()
            if steps_now:
                if clip_grad_norm is not None:
                    scaler.unscale_(optimizer)  # the norm of the true gradients, not of the scaled ones
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if schedule is not None:
                    schedule.advance(epoch - 1 + step / steps)
                if ema is not None:
                    ema.update()
            loss_sum += loss.detach().float() * count
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
    parameters and floating-point buffers of the model's state dict, kept in float32 (a decay near 1 makes each
    update too small for lower precisions). A sharded model's averages are DTensors like its parameters: each rank
    averages its own shard. Before start() (a run without --ema) it holds nothing and does nothing."""

    def __init__(self, model, decay: float | None = None):
        self.model, self.decay = distributed.unwrap(model), decay
        self.averages: dict[str, torch.Tensor] = {}  # by state dict name

    @property
    def active(self) -> bool:
        return bool(self.averages)

    @torch.no_grad()
    def start(self) -> None:
        """Begin the average at the model's weights."""
        self.averages = {name: tensor.detach().float().clone() for name, tensor in self._weights().items()}

    @torch.no_grad()
    def update(self) -> None:
        if self.averages:
            averages, weights = self._pairs()
            torch._foreach_lerp_(averages, [weight.float() for weight in weights], 1 - self.decay)

    @contextlib.contextmanager
    def swapped(self, wanted: bool = True):
        """The averages in the model's own tensors, in place, for the block (validation); then its weights again."""
        if not (wanted and self.averages):
            yield
            return
        with torch.no_grad():
            averages, weights = self._pairs()
            kept = [weight.clone() for weight in weights]
            torch._foreach_copy_(weights, averages)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(weights, kept)

    @torch.no_grad()
    def load(self, saved: dict) -> None:
        """Go on from a checkpoint's averages, whole tensors by name (a sharded model's rank takes its shard)."""
        self.start()
        for name, average in self.averages.items():
            value = saved[name].to(average.device)
            if isinstance(average, DTensor) and not isinstance(value, DTensor):
                value = distribute_tensor(value, average.device_mesh, average.placements, src_data_rank=None)
            average.copy_(value)

    def _weights(self) -> dict[str, torch.Tensor]:
        tensors = self.model.state_dict(keep_vars=True)
        return {name: tensor for name, tensor in tensors.items() if tensor.is_floating_point()}

    def _pairs(self) -> tuple[list, list]:
        """This rank's part of each average and of the weight it follows (the local shards of DTensors)."""
        weights = self._weights()
        return [_local(average) for average in self.averages.values()], [
            _local(weights[name]) for name in self.averages
        ]


@contextlib.contextmanager
def collective_timeouts(where: str | Callable[[], str], env: DistEnv):
    """A collective of the block that gives up after --dist-timeout, because a rank stopped answering, ends this
    rank in roll_call's one error line: `where` (the epoch and step; a callable is asked then, as a loop's step
    changes), and the ranks that stopped answering. A rank whose process or machine is gone (gloo: the connection
    closed) ends the others in one line too: an elastic job's launcher then restarts them.

    gloo raises the timeout in the call that waited. NCCL's watchdog, under TORCH_NCCL_ASYNC_ERROR_HANDLING=2
    (distributed.setup() and launcher.py set it unless it is set), aborts the communicator rather than the whole
    process, and the next collective raises it: the step named may be the one after the step that waited.
    """
    try:
        yield
    except RuntimeError as error:  # gloo's own, or NCCL's DistBackendError
        place = where() if callable(where) else where
        if env.world_size > 1 and re.search("Connection (closed|reset) by peer", str(error)):  # gloo: a rank is gone
            raise roll_call.peer_gone(place, shown=env.local_rank == 0) from None
        if env.world_size == 1 or not re.search("timed out|timing out", str(error), re.IGNORECASE):
            raise
        store = dist.distributed_c10d._get_default_store()  # the process group's own: torch has no public getter
        limit = f"--dist-timeout {store.timeout.total_seconds():g} s"  # the group's timeout is its store's
        remedy = "raise --dist-timeout if a rank may rightly take longer"
        raise roll_call.explained(place, limit, remedy, env.rank, env.world_size, store.add) from None


def evaluate(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None = None) -> dict:
    """task.metrics() over the whole validation set, and its size ("samples")."""
    size = loader.batch_sampler.dataset_size
    return {**task.metrics(_validated(model, loader, env, task, amp_dtype), size), "samples": size}


def out_of_fold(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None = None) -> list:
    """Every validation batch's (number, sums, per-sample values, predict_step()'s rows), from every rank: a
    fold's out-of-fold predictions and what cv.py pools."""
    return _validated(model, loader, env, task, amp_dtype, rows=True)


@out_of_memory_is_a_user_error(torch.OutOfMemoryError)
@torch.no_grad()
def _validated(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None, rows: bool = False) -> list:
    """Every validation batch's (number, sums, per-sample values[, rows]), from every rank, in the training's
    precision. The loader deals whole batches to the ranks (loaders.DealtBatches): each batch is the same
    whatever the number of processes, each sample counted once."""
    dealt = loader.batch_sampler
    # Ranks run different numbers of batches: DDP's forward would wait for the others, so the unwrapped model
    # runs them; a sharded model needs every rank in every forward, so ranks with fewer batches make up the
    # difference with passes over batch 0 that count for nothing.
    sharded = fsdp.is_sharded(model)
    model = model if sharded else distributed.unwrap(model)
    _rank_0s_buffers(model, env)
    model.eval()
    mine = [
        _contribution(model, batch, number, dealt, env, task, amp_dtype, rows)
        for number, batch in zip(dealt.numbers, loader, strict=True)
    ]
    for _ in range(dealt.most_batches - len(dealt.numbers) if sharded else 0):
        _contribution(model, _batch(loader, 0), 0, dealt, env, task, amp_dtype, rows)
    # One collective after the loop (ranks have different numbers of batches): every rank gets every batch's part.
    return [part for rank in distributed.all_gather_object(mine) for part in rank]


@out_of_memory_is_a_user_error(torch.OutOfMemoryError)
@torch.no_grad()
def check_task(model, loader: DataLoader, env: DistEnv, task: Task, amp_dtype: str | None = None) -> None:
    """task.validation_step() and metrics() on this rank's first and last validation batches, before training: a
    metric they miss, or a batch they cannot read, ends the run now in one line (training_loss() meets its first
    batch at the first step); two batches, mostly of different sizes, so that metrics() meets per-sample values
    padded as batches of different shapes make them (seam.padded()). The batches are made here, not by the loader,
    whose workers keep their place."""
    dealt = loader.batch_sampler
    sharded = fsdp.is_sharded(model)
    if not (dealt.numbers or sharded and dealt.most_batches):  # a sharded model's forward needs every rank
        return
    model = model if sharded else distributed.unwrap(model)
    model.eval()
    mine = dealt.numbers or [0]  # (a sharded model's ranks without a batch run batch 0, for nothing)
    # Two forwards on every rank, as a sharded model's ranks must meet in each.
    parts = {
        number: _contribution(model, _batch(loader, number), number, dealt, env, task, amp_dtype)
        for number in (mine[0], mine[-1])
    }
    if dealt.numbers:
        task.metrics(list(parts.values()), sum(map(dealt.size_of, parts)))


def _batch(loader: DataLoader, number: int):
    """Validation batch `number`, made here: the loader's workers keep their place."""
    return loader.collate_fn([loader.dataset[index] for index in loader.batch_sampler.indices(number)])


def _gradient_sync(model, enabled: bool):
    """A context for backward(): gradients reduced across ranks (`enabled`), or kept local to be summed with the
    next micro-batch's (gradient accumulation): DDP's no_sync(), FSDP's own switch."""
    model = getattr(model, "_orig_mod", model)
    if fsdp.is_sharded(model):
        model.set_requires_gradient_sync(enabled)
    elif not enabled and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def _rank_0s_buffers(model, env: DistEnv) -> None:
    """Rank 0's buffers on every rank: batch norm's running statistics, which each rank's own batches moved, while
    the checkpoint keeps rank 0's; so every rank evaluates the model that is saved."""
    if env.world_size > 1:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


def _contribution(
    model, batch, number: int, dealt, env: DistEnv, task: Task, amp_dtype: str | None, rows: bool = False
) -> tuple:
    """Batch `number`'s (number, sums, per-sample values) from task.validation_step(), in numpy; and its rows of
    predict_step() where asked for."""
    sample_count(batch)  # (an error of the data's code, raised in a loader worker, stops here)
    batch = loaders.to_device(batch, env.device)
    with _autocast(env, amp_dtype):
        sums, per_sample = task.validation_step(model, batch, dealt.size_of(number), _numpy)
        return (number, sums, per_sample, task.validation_rows(model, batch)) if rows else (number, sums, per_sample)


def _numpy(value) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def training_memory(model, optimizer) -> tuple[int, int]:
    """The model's parameters, and the bytes this process holds for them: its parameters (a sharded model's
    shards only), their gradients and the optimizer's state (as many tensors per parameter as this optimizer
    keeps: 1 for SGD with momentum, 2 for Adam; counted on a small parameter of its own, as its state is made
    at the first step)."""
    parameters = list(model.parameters())
    local = sum(_local(parameter).numel() * parameter.element_size() for parameter in parameters)
    return sum(parameter.numel() for parameter in parameters), local * (2 + _state_per_parameter(optimizer))


def _state_per_parameter(optimizer) -> int:
    """The tensors of a parameter's size the optimizer keeps, tried on a probe of its own on the parameters'
    device (0 for an optimizer that cannot be tried so: the log line is an estimate, never a reason to stop)."""
    try:
        device = optimizer.param_groups[0]["params"][0].device
        probe = torch.nn.Parameter(torch.ones(3, 5, device=device))
        accepted = inspect.signature(type(optimizer)).parameters  # (AdamW's defaults hold one it does not take)
        defaults = {name: value for name, value in optimizer.defaults.items() if name in accepted}
        trial = type(optimizer)([probe], **defaults)
        probe.grad = torch.ones_like(probe)
        trial.step()
    except Exception:  # an optimizer wrapper, one whose step needs a closure (LBFGS), ...
        return 0
    return sum(isinstance(value, torch.Tensor) and value.shape == probe.shape for value in trial.state[probe].values())


def _local(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.to_local() if hasattr(parameter, "to_local") else parameter  # a shard of FSDP's DTensor


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def whole_on_rank0_only(env: DistEnv, strategy: str, init_from: str | None):
    """Where build_model() makes the network's tensors: under --strategy fsdp or hsdp with --init-from, on the meta
    device (shapes, no memory) on every rank but 0, and fsdp.shard() sends them their shards of rank 0's weights; so
    only rank 0 ever holds the whole model, and only rank 0 reads the file. Elsewhere every rank makes it whole."""
    on_meta = init_from is not None and fsdp.shards(strategy, env.world_size) and not env.is_main
    return torch.device("meta") if on_meta else contextlib.nullcontext()


def names_as_in_a_new_process():
    """A context for one model's run among several in a process (--fold all): nothing to do in PyTorch, whose
    state dicts name tensors by their module path (Paddle's by a count through the process)."""
    return contextlib.nullcontext()


def epoch_rate(optimizer, schedule: Schedule | None, epoch: int) -> float:
    """The rate `epoch` begins at (a pass resumed within it began later), or the optimizer's without a schedule."""
    return (
        optimizer.param_groups[0]["lr"]
        if schedule is None
        else schedule.stepper.base_lrs[0] * schedule.factor(epoch - 1)
    )


def cosine_schedule(optimizer, epochs: int, warmup_epochs: float = 0.0) -> Schedule:
    """The optimizer's learning rate over `epochs`: a rise over `warmup_epochs`, then a cosine decay towards 0
    (state.Schedule), set after every optimizer step by a LambdaLR of the schedule's factor."""
    schedule = Schedule(epochs, warmup_epochs)
    schedule.stepper = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: schedule.factor())
    return schedule


def grad_scaler(amp_dtype: str | None) -> torch.amp.GradScaler:
    """Loss scaling, which float16 needs (bfloat16 has float32's range); a pass-through otherwise."""
    return torch.amp.GradScaler("cuda", enabled=amp_dtype == "fp16")


def mixed_precision(amp: bool, asked: str, env: DistEnv) -> str | None:
    """This run's autocast dtype on this rank's GPU, by hardware.amp_dtype()'s rule ("bf16", "fp16"; None: full
    precision). In full precision on a GPU that has TF32 (compute capability 8.0+), matrix products use it."""
    capability = torch.cuda.get_device_capability(env.device) if env.on_gpu else None
    dtype = hardware.amp_dtype(amp, asked, capability)
    if dtype is None and capability is not None and capability >= (8, 0):
        torch.backends.cuda.matmul.allow_tf32 = True  # cuDNN's convolutions use TF32 by default already
        log.info("full precision, with TF32 matrix maths (--amp for mixed precision)")
    return dtype


def _autocast(env: DistEnv, amp_dtype: str | None):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp_dtype)
    return torch.autocast(env.device.type, dtype=dtype, enabled=dtype is not None)


def configure_kernels(deterministic: bool) -> None:
    """cuDNN autotuning (the fastest kernels for the shapes it meets), or with --deterministic reproducible
    kernels only: deterministic algorithms, no autotuning, and cuBLAS's fixed workspace, whose variable must
    be set before CUDA starts (so: before distributed.setup())."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: an operation with no deterministic GPU kernel (the sample model's AdaptiveAvgPool2d backward)
    # runs anyway, and PyTorch warns once naming it, instead of stopping the run at its first step. Called only
    # to change the setting: the call imports torch._inductor, over a second of every run's start.
    if deterministic != torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
