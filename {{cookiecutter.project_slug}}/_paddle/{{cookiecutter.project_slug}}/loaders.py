"""The data loaders: each rank its shard of the data, --batch-size samples per batch; batches to the device."""

import multiprocessing
import os
import sys
import threading
import traceback

import numpy as np
import paddle
from paddle.io import DataLoader, Dataset, DistributedBatchSampler
from paddle.io.dataloader.collate import default_collate_fn

from . import hardware
from .batches import DealtBatches, GuardedCollate, GuardedDataset, RestOfEpoch, with_leaves
from .distributed import DistEnv
from .errors import UserError
from .roll_call import end_with_the_rank


class ResumableSampler(RestOfEpoch, DistributedBatchSampler):
    """A DistributedBatchSampler that can go on with a stopped epoch: it leaves out the first `consumed` samples
    of the epoch's order, those the ranks trained before the stop (on this or any other number of processes),
    and deals the rest as batches.rest_of_epoch() does, in batches of `batch_size`.

    The epoch's order is one permutation of the whole set by --seed and the epoch, whatever the number of ranks
    (Paddle's own sampler pads before it shuffles, so its order changes with the number of ranks). It pads the
    shards to equal length with `padding` repeated samples, so every rank takes as many steps.
    """

    def __init__(self, dataset: Dataset, batch_size: int, env: DistEnv, seed: int):
        super().__init__(dataset, batch_size, num_replicas=env.world_size, rank=env.rank, shuffle=True)
        self.seed, self.ranks = seed, env.world_size

    def __iter__(self):
        order = np.random.RandomState(self.seed + self.epoch).permutation(len(self.dataset)).tolist()
        share = self.share(order, self.local_rank)
        return (share[start : start + self.batch_size] for start in range(0, len(share), self.batch_size))

    def __len__(self) -> int:
        return -(-self.share_length() // self.batch_size)


def build_loaders(
    train_set: Dataset, val_set: Dataset, batch_size: int, workers: int | None, seed: int, env: DistEnv
) -> tuple[DataLoader, DataLoader]:
    """Loaders of `batch_size` samples per process; the train sampler reshuffles with set_epoch(), the validation
    loader deals whole batches (DistributedBatchSampler would pad with repeated samples, counted twice).

    `workers` None: chosen from the device and the cores this process may use (hardware.loader_workers()).
    The workers hand batches over in shared memory and stay alive across epochs (the two loaders never load
    at the same time: the validation loader gets half as many).
    """
    threading.excepthook = _exit_when_a_loader_thread_fails  # Paddle reads batches in a thread: see there
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    sampler = ResumableSampler(train_set, batch_size, env, seed)
    train_loader = DataLoader(GuardedDataset(train_set), batch_sampler=sampler, **_options(train_set, workers))
    dealt = DealtBatches(len(val_set), batch_size, env.rank, env.world_size)
    val_loader = DataLoader(GuardedDataset(val_set), batch_sampler=dealt, **_options(val_set, -(-workers // 2)))
    return train_loader, val_loader


def _options(dataset: Dataset, workers: int) -> dict:
    return dict(
        num_workers=workers, use_shared_memory=True, persistent_workers=workers > 0, worker_init_fn=end_with_the_rank,
        collate_fn=GuardedCollate(dataset, default_collate_fn),
    )  # fmt: skip


def predict_loader(dataset: Dataset, batch_size: int, workers: int | None, env: DistEnv) -> DataLoader:
    """predict.py's loader: this rank's whole batches of `dataset` (DealtBatches, its `batch_sampler`);
    `workers` None: as build_loaders() chooses."""
    threading.excepthook = _exit_when_a_loader_thread_fails  # an unreadable input would hang: see there
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    dealt = DealtBatches(len(dataset), batch_size, env.rank, env.world_size)
    return DataLoader(
        GuardedDataset(dataset), batch_sampler=dealt, num_workers=workers, use_shared_memory=True,
        collate_fn=GuardedCollate(dataset, default_collate_fn),
    )  # fmt: skip


def train_sampler(loader: DataLoader) -> ResumableSampler:
    """The training loader's ResumableSampler (a sampler of batches here, of samples in PyTorch)."""
    return loader.batch_sampler


def _exit_when_a_loader_thread_fails(failure, previous=threading.__excepthook__) -> None:
    """An error raised while reading a batch (an unreadable file) ends the process, with one line for a UserError.

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


def to_device(batch, device: str):
    """A batch of any structure (a tensor or numpy array, a tuple, a list, a dict, nested) with its arrays as
    tensors on `device` ("cpu", "gpu:N"). Paddle's loaders put their tensors on the process's device already."""
    return with_leaves(batch, lambda value: _on_device(value, device))


def _on_device(value, device: str):
    return paddle.to_tensor(value, place=device) if isinstance(value, np.ndarray) else value
