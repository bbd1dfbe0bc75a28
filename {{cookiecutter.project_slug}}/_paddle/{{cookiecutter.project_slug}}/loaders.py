"""The data loaders: each rank its shard of the data, --batch-size samples per batch."""

import itertools

from paddle.io import BatchSampler, DataLoader, Dataset, DistributedBatchSampler, Sampler

from .distributed import DistEnv


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
    train_set: Dataset, val_set: Dataset, batch_size: int, workers: int, seed: int, env: DistEnv
) -> tuple[DataLoader, DataLoader]:
    """Loaders of `batch_size` samples per process; the train sampler reshuffles with set_epoch()."""
    common = dict(num_workers=workers, persistent_workers=workers > 0)
    train_loader = DataLoader(train_set, batch_sampler=ResumableSampler(train_set, batch_size, env, seed), **common)
    val_sampler = BatchSampler(sampler=ShardSampler(len(val_set), env), batch_size=batch_size)
    val_loader = DataLoader(val_set, batch_sampler=val_sampler, **common)
    return train_loader, val_loader


def train_sampler(loader: DataLoader) -> ResumableSampler:
    """The training loader's ResumableSampler (a sampler of batches here, of samples in PyTorch)."""
    return loader.batch_sampler
