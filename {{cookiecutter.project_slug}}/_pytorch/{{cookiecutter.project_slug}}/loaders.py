"""The data loaders: each rank its shard of the data, --batch-size samples per batch; batches to the device."""

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

from . import hardware
from .batches import DealtBatches, GuardedCollate, GuardedDataset, RestOfEpoch, with_leaves
from .distributed import DistEnv
from .roll_call import end_with_the_rank


class ResumableSampler(RestOfEpoch, DistributedSampler):
    """A DistributedSampler that can go on with a stopped epoch: it leaves out the first `consumed` samples of
    the epoch's order, those the ranks trained before the stop (on this or any other number of processes), and
    deals the rest as batches.rest_of_epoch() does (with `consumed` 0, the samples DistributedSampler gives).

    It pads the shards to equal length with `padding` repeated samples, so every rank takes as many steps.
    """

    def __init__(self, dataset: Dataset, batch_size: int, env: DistEnv, seed: int):
        super().__init__(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed)
        self.batch_size, self.ranks = batch_size, env.world_size

    def __iter__(self):
        # DistributedSampler's order of the epoch: one permutation of the whole set, whatever the number of ranks.
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        return iter(self.share(order, self.rank))

    def __len__(self) -> int:
        return self.share_length()


def build_loaders(
    train_set: Dataset, val_set: Dataset, batch_size: int, workers: int | None, seed: int, env: DistEnv
) -> tuple[DataLoader, DataLoader]:
    """Loaders of `batch_size` samples per process; the train sampler reshuffles with set_epoch(), the validation
    loader deals whole batches (DistributedSampler would pad with repeated samples, counted twice).

    `workers` None: chosen from the device and the cores this process may use (hardware.loader_workers()).
    On GPUs batches go to pinned memory, and the workers of both loaders stay alive across epochs (they
    never load at the same time: the validation loader gets half as many).
    """
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    train_loader = DataLoader(
        GuardedDataset(train_set), sampler=ResumableSampler(train_set, batch_size, env, seed), batch_size=batch_size,
        **_options(train_set, workers, env),
    )  # fmt: skip
    dealt = DealtBatches(len(val_set), batch_size, env.rank, env.world_size)
    val_loader = DataLoader(GuardedDataset(val_set), batch_sampler=dealt, **_options(val_set, -(-workers // 2), env))
    return train_loader, val_loader


def _options(dataset: Dataset, workers: int, env: DistEnv) -> dict:
    return dict(
        num_workers=workers, pin_memory=env.on_gpu, persistent_workers=workers > 0, worker_init_fn=end_with_the_rank,
        collate_fn=GuardedCollate(dataset, default_collate),
    )  # fmt: skip


def predict_loader(dataset: Dataset, batch_size: int, workers: int | None, env: DistEnv) -> DataLoader:
    """predict.py's loader: this rank's whole batches of `dataset` (DealtBatches, its `batch_sampler`);
    `workers` None: as build_loaders() chooses."""
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    dealt = DealtBatches(len(dataset), batch_size, env.rank, env.world_size)
    return DataLoader(
        GuardedDataset(dataset), batch_sampler=dealt, num_workers=workers, pin_memory=env.on_gpu,
        collate_fn=GuardedCollate(dataset, default_collate),
    )  # fmt: skip


def train_sampler(loader: DataLoader) -> ResumableSampler:
    """The training loader's ResumableSampler (a sampler of samples here, of batches in Paddle)."""
    return loader.sampler


def to_device(batch, device: torch.device):
    """A batch of any structure (a tensor or numpy array, a tuple, a list, a dict, nested) with its arrays as
    tensors on `device`."""
    return with_leaves(batch, lambda value: _on_device(value, device))


def _on_device(value, device: torch.device):
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
