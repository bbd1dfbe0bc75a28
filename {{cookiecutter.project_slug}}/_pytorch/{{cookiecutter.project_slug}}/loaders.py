"""The data loaders: each rank its shard of the data, --batch-size samples per batch."""

import itertools

from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

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


class ResumableDistributedSampler(DistributedSampler):
    """A DistributedSampler that can begin its epoch after the first `skip` samples: a stopped epoch goes on."""

    skip = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return self.num_samples - self.skip


def build_loaders(train_set: Dataset, val_set: Dataset, args, env: DistEnv) -> tuple[DataLoader, DataLoader]:
    """Loaders of --batch-size samples per process; the train sampler reshuffles with set_epoch()."""
    train_sampler = ResumableDistributedSampler(
        train_set, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed
    )
    common = dict(
        batch_size=args.batch_size,
        num_workers=args.workers,
        pin_memory=env.device.type == "cuda",
        persistent_workers=args.workers > 0,
    )
    train_loader = DataLoader(train_set, sampler=train_sampler, **common)
    val_loader = DataLoader(val_set, sampler=ShardSampler(len(val_set), env), **common)
    return train_loader, val_loader
