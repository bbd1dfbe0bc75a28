"""Logging and metrics: rank 0 to the console and train.log, other ranks to their own files; the loss lines, the
metrics.jsonl rows, the trackers' curves; and the wait for batches (LoaderWatch)."""

import importlib.util
import json
import logging
import math
import multiprocessing
import sys
import time
from pathlib import Path

from tqdm import tqdm

from . import hardware, settings
from .errors import UserError

PACKAGE_LOGGER = logging.getLogger(__package__)
_VERSION_ON_CONSOLE = False  # whether this process's console has had the version line


def setup_logging(output_dir: str | Path | None, rank: int) -> logging.Logger:
    """Rank 0 logs to the console and OUTPUT_DIR/train.log, the others to OUTPUT_DIR/logs/rankN.log, each starting
    with the template's version; with no output_dir (predict.py), rank 0 to the console only, the others nowhere."""
    global _VERSION_ON_CONSOLE
    if output_dir is None:
        handlers = [logging.StreamHandler(sys.stdout)] if rank == 0 else [logging.NullHandler()]
    elif rank == 0:
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        handlers = [logging.StreamHandler(sys.stdout), logging.FileHandler(output_dir / "train.log")]
    else:
        rank_dir = Path(output_dir) / "logs"
        rank_dir.mkdir(parents=True, exist_ok=True)
        handlers = [logging.FileHandler(rank_dir / f"rank{rank}.log")]
    formatter = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")
    PACKAGE_LOGGER.handlers.clear()
    for handler in handlers:
        handler.setFormatter(formatter)
        PACKAGE_LOGGER.addHandler(handler)
    PACKAGE_LOGGER.setLevel(logging.INFO)
    PACKAGE_LOGGER.propagate = False
    if output_dir is not None:  # a log's first line: which template version it runs (README: later changes)
        line = PACKAGE_LOGGER.makeRecord(__package__, logging.INFO, __file__, 0, "%s: dist-template %s",
                                         (__package__, settings.TEMPLATE_VERSION), None)  # fmt: skip
        for handler in handlers:  # the console's once (a run of --folds sets up each fold's log)
            if isinstance(handler, logging.FileHandler) or not _VERSION_ON_CONSOLE:
                handler.handle(line)
        _VERSION_ON_CONSOLE = True
    return PACKAGE_LOGGER


def progress_bar(iterable, is_main: bool, desc: str, total: int | None = None):
    """A progress bar on rank 0: a widget in a notebook's kernel (text where the kernel has no ipywidgets), text at
    a terminal; job logs get the loss lines instead."""
    kernel = is_main and in_kernel()
    if kernel and _widgets_installed():
        # tqdm.notebook rather than tqdm.auto: tqdm.auto's bar starts an iterator of its own (a second pass of a
        # DataLoader, one more shuffle of the sampler).
        from tqdm.notebook import tqdm as widget_bar

        return widget_bar(iterable, desc=desc, leave=False, total=total)
    return tqdm(iterable, desc=desc, leave=False, total=total, disable=not (kernel or is_main and sys.stderr.isatty()))


def in_kernel() -> bool:
    """True in a Jupyter kernel's own process; False in a job, and in the processes notebook.launch() starts (copies
    of the kernel, IPython loaded, started by multiprocessing)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and hasattr(shell, "kernel") and multiprocessing.parent_process() is None


def _widgets_installed() -> bool:
    try:
        import ipywidgets  # noqa: F401 - tqdm's widget needs it; many kernels (AI Studio's, a plain Jupyter) lack it
    except ImportError:
        return False
    return True


PRECISION = {"bf16": "bfloat16 mixed precision", "fp16": "float16 mixed precision with loss scaling"}


def log_job(
    env, batch_size: int, grad_accum: int, train_samples: int, val_samples: int, workers: int, amp_dtype: str | None
) -> int:
    """Say how the job is split, and return the global batch: per-process batch x processes x accumulation."""
    global_batch = batch_size * env.world_size * grad_accum
    PACKAGE_LOGGER.info(
        "%d process(es) on %s, %s; batch %d per process x %d x %d accumulation = global batch %d; %d train / %d "
        "val samples; %d loader worker(s) per process",
        env.world_size, "gpu" if env.on_gpu else "cpu", PRECISION.get(amp_dtype, "full precision"), batch_size,
        env.world_size, grad_accum, global_batch, train_samples, val_samples, workers,
    )  # fmt: skip
    return global_batch


def log_model(strategy: str, parameters: int, bytes_per_process: int) -> None:
    """Say how much of the model each process holds: its parameters, their gradients and the optimizer's state."""
    PACKAGE_LOGGER.info(
        "strategy %s: %s parameters, %.3f GB of parameters + gradients + optimizer state per process",
        strategy, f"{parameters:,}", bytes_per_process / 1e9,
    )  # fmt: skip


class MetricsLog:
    """metrics.jsonl: rank 0 appends one line per finished epoch (the keys README.md lists); every rank logs it.

    A resumed run first forgets the epochs its checkpoint does not cover, so no epoch is logged twice. A run that
    starts afresh over an earlier one forgets that run's at its first epoch's end, as its checkpoints replace the
    earlier ones: a run that fails before leaves both as they were.
    """

    def __init__(self, path: Path, is_main: bool, epochs: int, epochs_done: int, **per_run):
        self.path, self.is_main, self.epochs, self.per_run = Path(path), is_main, epochs, per_run
        # --resume none over an earlier run (or a folder whose saves are gone)
        self.afresh = is_main and not epochs_done and any(map(epoch_of, _lines(self.path)))
        if self.afresh:
            PACKAGE_LOGGER.warning(
                "this run starts afresh in %s: the earlier run's metrics and saves there are replaced as its epochs "
                "end (a new --output-dir keeps them)", self.path.parent,
            )  # fmt: skip
        elif is_main:
            drop_metrics_after(self.path, epochs_done)

    def report(self, epoch: int, train_stats: dict, val_stats: dict, started: float) -> dict:
        """`val_stats`: task.metrics() of the validation set (val_<name> each), and its "samples"."""
        record = {
            "epoch": epoch,
            "train_loss": train_stats["loss"],
            **validation_record(val_stats),
            **self.per_run,
            "train_samples": train_stats["samples"],
            "val_samples": val_stats["samples"],
            "epoch_time_s": round(time.perf_counter() - started, 3),
            "data_wait": round(train_stats["data_wait"], 4),
            "lr": train_stats["lr"],
        }
        if self.is_main:
            if self.afresh:
                self.path.write_text("", encoding="utf-8")
                self.afresh = False
            append_metrics(self.path, record)
        PACKAGE_LOGGER.info(
            "epoch %d/%d train_loss %.4f %s (%.1f s)",
            epoch, self.epochs, record["train_loss"], _numbers(validation_record(val_stats)), record["epoch_time_s"],
        )  # fmt: skip
        return record


def validation_record(val_stats: dict) -> dict:
    """val_loss first, then val_<name> for each other metric, in the task's order."""
    metrics = {name: value for name, value in val_stats.items() if name != "samples"}
    named = {f"val_{name}": value for name, value in metrics.items() if name != "loss"}
    return {"val_loss": metrics["loss"], **named}


def _numbers(record: dict) -> str:
    return " ".join(f"{name} {value:.4f}" for name, value in record.items())


def best_of(state) -> str:
    """The done line's best metric (a TrainingState's): `val_loss 0.0889`, or that no epoch had a finite one."""
    if state.best_value is None:
        return f"val_{state.best_metric} none (no epoch had a finite value)"
    return f"val_{state.best_metric} {state.best_value:.4f}"


def report_evaluation(output_dir: Path, val_stats: dict, is_main: bool, checkpoint) -> None:
    """--evaluate's result: OUTPUT_DIR/eval.json (rank 0, whole or not at all) and one `eval:` line."""
    record = {**validation_record(val_stats), "val_samples": val_stats["samples"], "checkpoint": str(checkpoint)}
    if is_main:
        path = Path(output_dir) / "eval.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json_text(record, indent=1) + "\n", encoding="utf-8")
        temporary.replace(path)
    numbers = _numbers(
        {name: value for name, value in record.items() if name.startswith("val_") and name != "val_samples"}
    )
    PACKAGE_LOGGER.info("eval: %s (%d samples; %s)", numbers, val_stats["samples"], checkpoint)


def append_metrics(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(json_text(record) + "\n")


def json_text(record: dict, indent: int | None = None) -> str:
    """The record as JSON, a number that is not finite (an AUC of a validation set with one class: nan) as null:
    JSON has no NaN, and jq, JavaScript or a JSON schema refuse a file that holds one."""

    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        return [finite(item) for item in value] if isinstance(value, list | tuple) else value

    return json.dumps(finite(record), indent=indent, allow_nan=False)


def drop_metrics_after(path: Path, epoch: int) -> None:
    """Forget epochs a checkpoint does not cover, so a resumed run never logs one twice."""
    lines = _lines(path)
    kept = [line for line in lines if (recorded := epoch_of(line)) is not None and recorded <= epoch]
    if len(kept) != len(lines):
        path.write_text("".join(kept), encoding="utf-8")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else []


def epoch_of(line: str) -> int | None:
    """The epoch a metrics line records; None for a line torn by a crash mid-write."""
    try:
        return json.loads(line)["epoch"]
    except (ValueError, KeyError, TypeError):
        return None


class LossLog:
    """The loss lines of an epoch, for both training loops and paddle.Model.fit's callback: every `every` batches
    (None: about five an epoch, at most 50 batches apart), rank 0 logs the epoch's mean loss so far and gives it
    to `tracker`, at the optimizer step."""

    def __init__(self, is_main: bool, epoch: int, steps: int, grad_accum: int, every: int | None, tracker=None):
        self.is_main, self.epoch, self.steps, self.grad_accum, self.tracker = is_main, epoch, steps, grad_accum, tracker
        self.every = every or max(1, min(50, steps // 5))

    def step(self, step: int, loss_sum, seen: int) -> None:
        """After batch `step`: `loss_sum` (a number, or a one-element tensor, read only when a line is due) over
        `seen` samples."""
        if step % self.every or not self.is_main:
            return
        mean_loss = float(loss_sum) / seen
        PACKAGE_LOGGER.info("epoch %d step %d/%d loss %.4f", self.epoch, step, self.steps, mean_loss)
        if self.tracker is not None and math.isfinite(mean_loss):  # a diverged loss stops at the next vote
            self.tracker.loss(optimizer_step(self.epoch, step, self.steps, self.grad_accum), mean_loss)


def optimizer_step(epoch: int, batch: int, batches_per_epoch: int, grad_accum: int) -> int:
    """Optimizer steps taken since the run began, once `batch` batches of `epoch` (1-based) are done."""
    per_epoch = -(-batches_per_epoch // grad_accum)  # the last, shorter accumulation steps too
    return (epoch - 1) * per_epoch + -(-batch // grad_accum)


class TrackerBase:
    """Rank 0's curves (tracking.Tracker: TensorBoard or VisualDL; trackers.py's MLflow and W&B); a no-op on other
    ranks and with --no-tracking.

    start_step and start_epoch say where the run resumes (optimizer steps and epochs already
    done, 0 for a fresh run): anything recorded beyond them earlier is dropped. The framework's
    Tracker names its PACKAGE and FOLDER, and opens the writer of "steps" or "epochs" in _writer().
    """

    PACKAGE = FOLDER = ""

    def __init__(self, output_dir: str | Path, env, enabled: bool = True, start_step: int = 0, start_epoch: int = 0):
        self.active = enabled and env.is_main
        self.directory = Path(output_dir) / self.FOLDER
        self.start = {"steps": start_step, "epochs": start_epoch}
        self.writers: dict = {}
        self.finished = False  # best() says the run ended
        if self.active and importlib.util.find_spec(self.PACKAGE) is None:
            raise UserError(
                f"tracking needs the {self.PACKAGE} package: pip install {self.PACKAGE}, or pass --no-tracking"
            )

    @classmethod
    def resuming(
        cls, output_dir, env, enabled: bool, state, batches_per_epoch: int, grad_accum: int, batch_size: int = 1
    ):
        """A tracker whose curves go on from `state` (the TrainingState a checkpoint restored; a stopped epoch's
        batches counted in this run's, of `batch_size`)."""
        done = state.progress.batches_done(batch_size, env.world_size)
        start_step = optimizer_step(state.epochs_done + 1, done, batches_per_epoch, grad_accum)
        return cls(output_dir, env, enabled, start_step=start_step, start_epoch=state.epochs_done)

    def loss(self, step: int, value: float) -> None:
        """The training loss at optimizer step `step` (see optimizer_step())."""
        if self.active:
            self._writer("steps").add_scalar("train/loss", float(value), step)

    def epoch(self, epoch: int, record: dict) -> None:
        """A metrics.jsonl record: each number in it at step = epoch; then everything is on disk."""
        if not self.active:
            return
        writer = self._writer("epochs")
        for tag, value in epoch_numbers(record).items():
            writer.add_scalar(tag, value, epoch)
        for writer in self.writers.values():
            writer.flush()

    def best(self, path: Path | None) -> None:
        """The best checkpoint's path, at the end of a run (a stopped or failed one ends without it): for the trackers
        that record it (trackers.py)."""
        self.finished = True

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()

    def _writer(self, run: str):
        raise NotImplementedError


def epoch_numbers(record: dict) -> dict[str, float]:
    """A metrics.jsonl record's numbers but the epoch, by their trackers' tags (epoch/<name>)."""
    return {
        f"epoch/{key}": float(value)
        for key, value in record.items()
        if key != "epoch" and isinstance(value, int | float) and not isinstance(value, bool)
    }


CHECK_AFTER_STEPS = 20  # the first steps of a run include the workers' start


class LoaderWatch:
    """How long training waits for its batches: data_wait in every metrics.jsonl row, and one hint when more
    loader workers would help.

    The wait is the host's time inside the loader's next(), read from the clock with no device synchronisation:
    a GPU step that is still running does not count as waiting for data. Whether the loader computes or waits on
    storage is told by the CPU time of the loop's own thread during the wait (where PyTorch loads with --workers 0;
    the framework's other threads may spin meanwhile; paddle reads in a thread of its own, so there a slow loader
    with --workers 0 counts as waiting on storage).
    """

    def __init__(self, workers: int, loader_cores: int, is_main: bool):
        """`loader_cores`: the cores this process's loader workers may use (hardware.loader_cores())."""
        self.workers, self.loader_cores, self.is_main = workers, loader_cores, is_main
        self.checked = False
        self.start_epoch()

    @classmethod
    def of(cls, loader, env) -> "LoaderWatch":
        """The watch of a training loader of this process (a distributed.DistEnv)."""
        cores = hardware.loader_cores(env.on_gpu, env.local_world_size, hardware.usable_cores())
        return cls(loader.num_workers, cores, env.is_main)

    def start_epoch(self) -> None:
        self.started, self.wait, self.wait_cpu, self.steps = time.perf_counter(), 0.0, 0.0, 0
        self.judged_from = (self.started, 0.0)  # the hint's window: its start, and the wait before it

    def batches(self, loader):
        """The loader's batches, each wait for one timed."""
        self.start_epoch()
        batches = iter(loader)
        while True:
            asked, asked_cpu = time.perf_counter(), time.thread_time()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.waited(time.perf_counter() - asked, time.thread_time() - asked_cpu)
            yield batch

    def waited(self, seconds: float, cpu_seconds: float) -> None:
        """One batch came after `seconds` (of which the loop's thread computed `cpu_seconds`)."""
        self.wait += seconds
        self.wait_cpu += cpu_seconds
        self.steps += 1
        if self.steps == 2:  # the hint judges the loader from here: the first step compiles, autotunes and warms up
            self.judged_from = (time.perf_counter() - seconds, self.wait - seconds)
        if self.steps == CHECK_AFTER_STEPS and not self.checked:
            self.checked = True
            hint = self.hint()
            if hint and self.is_main:
                PACKAGE_LOGGER.warning(hint)

    @property
    def data_wait(self) -> float:
        """The part of the epoch's training time so far spent waiting for batches."""
        return self.wait / max(time.perf_counter() - self.started, 1e-9)

    def hint(self) -> str | None:
        """What to change when the loop waits on its loader more than on its model and more workers can help:
        there are cores to spare, or the loader waits on storage (it computes less than half the time it takes)."""
        since, waited_before = self.judged_from
        share = (self.wait - waited_before) / max(time.perf_counter() - since, 1e-9)
        if share <= 0.5:
            return None
        on_storage = self.workers == 0 and self.wait_cpu < 0.5 * self.wait
        if on_storage:
            more, why = 4, "it waits on storage more than it computes"
        elif self.loader_cores > self.workers:
            more, why = self.loader_cores, f"{self.loader_cores} cores are free for them"
        else:
            return None
        return (
            f"training waits for its data {100 * share:.0f} % of the time with --workers {self.workers} "
            f"({why}): try --workers {more}"
        )
