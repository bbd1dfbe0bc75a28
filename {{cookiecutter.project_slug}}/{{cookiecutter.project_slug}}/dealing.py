"""Whole batches dealt to the ranks, for validation and prediction: the same batches whatever the number of
processes, so each sample's numbers are too, and every sample is counted once (no padding)."""


class DealtBatches:
    """The batches [0, B), [B, 2B), ... of a dataset of `dataset_size`; rank r takes batches r, r + world, ...

    A batch sampler of either framework's DataLoader. Ranks may get different numbers of
    batches (none, for a set smaller than the world's batches): no collective per batch.
    """

    shuffle = drop_last = False  # read by paddle's DataLoader, as of its own batch samplers

    def __init__(self, dataset_size: int, batch_size: int, rank: int = 0, world_size: int = 1):
        self.dataset_size, self.batch_size = dataset_size, batch_size
        self.numbers = list(range(rank, -(-dataset_size // batch_size), world_size))

    def size_of(self, number: int) -> int:
        """The samples in batch `number`: all but the very last batch are full."""
        return min(self.batch_size, self.dataset_size - number * self.batch_size)

    def indices(self, number: int) -> range:
        return range(number * self.batch_size, number * self.batch_size + self.size_of(number))

    def __iter__(self):
        return (list(self.indices(number)) for number in self.numbers)

    def __len__(self) -> int:
        return len(self.numbers)
