"""Which samples go where, the same on every rank: whole batches dealt to the ranks, for validation and prediction
(the same batches whatever the number of processes, so each sample's numbers are too, and every sample is counted
once: no padding); the samples held out for validation."""

import numpy as np


class DealtBatches:
    """The batches [0, B), [B, 2B), ... of a dataset of `dataset_size`; rank r takes batches r, r + world, ...

    A batch sampler of either framework's DataLoader. Ranks may get different numbers of
    batches (none, for a set smaller than the world's batches): no collective per batch.
    """

    shuffle = drop_last = False  # read by paddle's DataLoader, as of its own batch samplers

    def __init__(self, dataset_size: int, batch_size: int, rank: int = 0, world_size: int = 1):
        self.dataset_size, self.batch_size = dataset_size, batch_size
        batches = -(-dataset_size // batch_size)
        self.numbers = list(range(rank, batches, world_size))
        self.most_batches = -(-batches // world_size)  # those of the ranks with most

    def size_of(self, number: int) -> int:
        """The samples in batch `number`: all but the very last batch are full."""
        return min(self.batch_size, self.dataset_size - number * self.batch_size)

    def indices(self, number: int) -> range:
        return range(number * self.batch_size, number * self.batch_size + self.size_of(number))

    def __iter__(self):
        return (list(self.indices(number)) for number in self.numbers)

    def __len__(self) -> int:
        return len(self.numbers)


def rest_of_epoch(order: list[int], consumed: int, rank: int, world_size: int) -> list[int]:
    """Rank `rank`'s samples of an epoch whose global `order` (the same on every rank and for any number of
    processes) goes on after its first `consumed` samples: the rest, padded with the order's first samples so
    that every rank takes as many steps, taken every `world_size`-th from `rank` on (as DistributedSampler does).

    After k batches of B samples on each of W ranks, the ranks together have trained the first consumed + k·B·W
    samples of the order: a stopped epoch goes on from that count on any number of processes, no sample twice
    and none left out.
    """
    consumed = min(consumed, len(order))  # (a set that shrank since the stop: its epoch ends)
    rest = order[consumed:]
    rest += [order[i % len(order)] for i in range(padding_of(len(order), consumed, world_size))]
    return rest[rank::world_size]


def padding_of(size: int, consumed: int, world_size: int) -> int:
    """The repeated samples rest_of_epoch() adds: not distinct, so not counted among an epoch's samples."""
    return -(size - min(consumed, size)) % world_size


def share_size(size: int, consumed: int, world_size: int) -> int:
    """The length of each rank's rest_of_epoch()."""
    return (size - min(consumed, size) + padding_of(size, consumed, world_size)) // world_size


def split_by_label(labels: list[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(kept, held out): sorted indices, `fraction` of each label's samples held out for validation (rounded; at
    least one of a label of two or more, never all of one). Each label draws from a generator of its own, (seed,
    label), never the global one: the same split on every rank and every run for a seed, and samples added to one
    label change nothing of another's."""
    labels_array = np.asarray(labels)
    held: set[int] = set()
    for label in sorted(set(labels)):
        members = np.flatnonzero(labels_array == label)
        count = 0 if len(members) < 2 else min(len(members) - 1, max(1, int(fraction * len(members) + 0.5)))
        rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, int(label)])
        held.update(rng.permutation(members)[:count].tolist())
    return [index for index in range(len(labels)) if index not in held], sorted(held)
