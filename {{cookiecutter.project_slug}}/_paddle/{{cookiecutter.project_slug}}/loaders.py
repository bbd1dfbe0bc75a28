"""The data loaders: each rank its shard of the data, --batch-size samples per batch."""

import itertools
import multiprocessing
import os
import sys
import threading
import traceback
from pathlib import Path

from paddle.io import BatchSampler, DataLoader, Dataset, DistributedBatchSampler, Sampler

from . import hardware
from .child_processes import end_with_the_rank
from .distributed import DistEnv
from .errors import UserError


class ShardSampler(Sampler):
    """Rank r takes samples r, r + world, r + 2*world, ...: every sample exactly once, no padding.

    DistributedBatchSampler pads shards to equal length with repeated samples,
    which would count some validation samples twice.
    """

    def __init__(self, dataset_size: int, env: DistEnv):
        super().__init__()
        self.indices = range(env.rank, dataset_size, env.world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ResumableSampler(DistributedBatchSampler):
    """A DistributedBatchSampler that can begin its epoch after `skip_batches` batches: a stopped epoch goes on.

    It pads the shards to equal length with `padding` repeated samples, so every rank takes as many steps.
    `seed` is not used: Paddle's sampler shuffles by the epoch alone (PyTorch's by seed + epoch).
    """

    skip_batches = 0

    def __init__(self, dataset: Dataset, batch_size: int, env: DistEnv, seed: int):
        super().__init__(dataset, batch_size, num_replicas=env.world_size, rank=env.rank, shuffle=True)

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)

    @property
    def padding(self) -> int:
        return self.total_size - len(self.dataset)


def build_loaders(
    train_set: Dataset, val_set: Dataset, batch_size: int, workers: int | None, seed: int, env: DistEnv
) -> tuple[DataLoader, DataLoader]:
    """Loaders of `batch_size` samples per process; the train sampler reshuffles with set_epoch().

    `workers` None: chosen from the device and the cores this process may use (hardware.loader_workers()).
    The workers hand batches over in shared memory and stay alive across epochs (the two loaders never load
    at the same time: the validation loader gets half as many).
    """
    threading.excepthook = _exit_when_a_loader_thread_fails  # Paddle reads batches in a thread: see there
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    train_loader = DataLoader(
        train_set, batch_sampler=ResumableSampler(train_set, batch_size, env, seed), **_options(workers)
    )
    val_sampler = BatchSampler(sampler=ShardSampler(len(val_set), env), batch_size=batch_size)
    val_loader = DataLoader(val_set, batch_sampler=val_sampler, **_options(-(-workers // 2)))
    return train_loader, val_loader


def _options(workers: int) -> dict:
    return dict(
        num_workers=workers, use_shared_memory=True, persistent_workers=workers > 0, worker_init_fn=end_with_the_rank
    )


class ImageFiles(Dataset):
    """Images read by `read` (submission.image_reader()) from their paths: predict.py's, decoded in the workers."""

    def __init__(self, paths: list[Path], read):
        super().__init__()
        self.paths, self.read = paths, read

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        return self.read(self.paths[index])


def image_loader(paths: list[Path], read, batch_size: int, workers: int | None, env: DistEnv) -> DataLoader:
    """The images of `paths` in their order, `batch_size` per batch; `workers` None: as build_loaders() chooses."""
    threading.excepthook = _exit_when_a_loader_thread_fails  # an unreadable image would hang: see there
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    return DataLoader(ImageFiles(paths, read), batch_size=batch_size, num_workers=workers, use_shared_memory=True)


def train_sampler(loader: DataLoader) -> ResumableSampler:
    """The training loader's ResumableSampler (a sampler of batches here, of samples in PyTorch)."""
    return loader.batch_sampler


def _exit_when_a_loader_thread_fails(failure, previous=threading.__excepthook__) -> None:
    """An error raised while reading a batch (a corrupt image) ends the process, with one line for a UserError.

    Paddle's DataLoader reads batches in a thread of the training process. With
    --workers 0 an error there ends only that thread, and training then waits for its
    batch forever; with workers, the loop gets a SystemError ("blocking queue is
    killed") in place of the error. Ending the process here (and its loader workers)
    gives the `error:` line explain_user_errors() would; the launcher then stops the
    other ranks.
    """
    frames = traceback.walk_tb(failure.exc_traceback)
    from_loader = any("paddle/io/dataloader" in frame.f_code.co_filename.replace("\\", "/") for frame, _ in frames)
    if not from_loader or issubclass(failure.exc_type, SystemExit):
        previous(failure)
        return
    if issubclass(failure.exc_type, UserError):
        sys.stderr.write(f"error: {failure.exc_value}\n")
    else:
        previous(failure)  # the traceback, as Python prints it
    for worker in multiprocessing.active_children():  # the loader's workers would outlive this process
        worker.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
