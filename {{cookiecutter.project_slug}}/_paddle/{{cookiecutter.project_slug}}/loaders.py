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


class ResumableBatchSampler(DistributedBatchSampler):
    """A DistributedBatchSampler that can begin its epoch after the first `skip` batches: a stopped epoch goes on."""

    skip = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


def build_loaders(train_set: Dataset, val_set: Dataset, args, env: DistEnv) -> tuple[DataLoader, DataLoader]:
    """Loaders of --batch-size samples per process; the train sampler reshuffles with set_epoch()."""
    train_sampler = ResumableBatchSampler(
        train_set, args.batch_size, num_replicas=env.world_size, rank=env.rank, shuffle=True
    )
    val_sampler = BatchSampler(sampler=ShardSampler(len(val_set), env), batch_size=args.batch_size)
    common = dict(num_workers=args.workers, persistent_workers=args.workers > 0)
    train_loader = DataLoader(train_set, batch_sampler=train_sampler, **common)
    val_loader = DataLoader(val_set, batch_sampler=val_sampler, **common)
    return train_loader, val_loader
