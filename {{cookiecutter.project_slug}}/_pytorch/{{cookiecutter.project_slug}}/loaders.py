"""The data loaders: each rank its shard of the data, --batch-size samples per batch."""

import itertools
from pathlib import Path

from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from . import hardware
from .child_processes import end_with_the_rank
from .distributed import DistEnv


class ShardSampler(Sampler):
    """Rank r takes samples r, r + world, r + 2*world, ...: every sample exactly once, no padding.

    DistributedSampler pads shards to equal length with repeated samples, which
    would count some validation samples twice.
    """

    def __init__(self, dataset_size: int, env: DistEnv):
        self.indices = range(env.rank, dataset_size, env.world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can begin its epoch after `skip_batches` batches: a stopped epoch goes on.

    It pads the shards to equal length with `padding` repeated samples, so every rank takes as many steps.
    """

    skip_batches = 0

    def __init__(self, dataset: Dataset, batch_size: int, env: DistEnv, seed: int):
        super().__init__(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed)
        self.batch_size = batch_size

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip_batches * self.batch_size, None)

    def __len__(self) -> int:
        return max(self.num_samples - self.skip_batches * self.batch_size, 0)

    @property
    def padding(self) -> int:
        return self.total_size - len(self.dataset)


def build_loaders(
    train_set: Dataset, val_set: Dataset, batch_size: int, workers: int | None, seed: int, env: DistEnv
) -> tuple[DataLoader, DataLoader]:
    """Loaders of `batch_size` samples per process; the train sampler reshuffles with set_epoch().

    `workers` None: chosen from the device and the cores this process may use (hardware.loader_workers()).
    On GPUs batches go to pinned memory, and the workers of both loaders stay alive across epochs (they
    never load at the same time: the validation loader gets half as many).
    """
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    train_loader = DataLoader(
        train_set, sampler=ResumableSampler(train_set, batch_size, env, seed), **_options(batch_size, workers, env)
    )
    val_loader = DataLoader(
        val_set, sampler=ShardSampler(len(val_set), env), **_options(batch_size, -(-workers // 2), env)
    )
    return train_loader, val_loader


def _options(batch_size: int, workers: int, env: DistEnv) -> dict:
    return dict(
        batch_size=batch_size, num_workers=workers, pin_memory=env.on_gpu, persistent_workers=workers > 0,
        worker_init_fn=end_with_the_rank,
    )  # fmt: skip


class ImageFiles(Dataset):
    """Images read by `read` (submission.image_reader()) from their paths: predict.py's, decoded in the workers."""

    def __init__(self, paths: list[Path], read):
        self.paths, self.read = paths, read

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        return self.read(self.paths[index])


def image_loader(paths: list[Path], read, batch_size: int, workers: int | None, env: DistEnv) -> DataLoader:
    """The images of `paths` in their order, `batch_size` per batch; `workers` None: as build_loaders() chooses."""
    if workers is None:
        workers = hardware.loader_workers(env.on_gpu, env.local_world_size, hardware.usable_cores())
    return DataLoader(ImageFiles(paths, read), batch_size=batch_size, num_workers=workers, pin_memory=env.on_gpu)


def train_sampler(loader: DataLoader) -> ResumableSampler:
    """The training loader's ResumableSampler (a sampler of samples here, of batches in Paddle)."""
    return loader.sampler
