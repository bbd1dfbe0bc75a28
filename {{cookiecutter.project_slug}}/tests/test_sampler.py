"""How the data is split across ranks: training shards reshuffle every epoch, validation counts each sample once.

Framework-free: the loaders take any map-style dataset (here a list) and read only the rank,
the world size and whether a GPU is in use from the environment.
"""

from types import SimpleNamespace

import pytest

from {{ cookiecutter.project_slug }} import loaders
from {{ cookiecutter.project_slug }}.dealing import DealtBatches


def env_of(rank: int, world_size: int) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, local_rank=rank, world_size=world_size, on_gpu=False, is_main=rank == 0)


def numbered(size: int) -> list[tuple[int, int]]:
    """Sample i is the number i, so a batch tells which samples it holds."""
    return [(i, 0) for i in range(size)]


def samples_seen(loader) -> list[int]:
    return [int(i) for batch, _ in loader for i in batch]


def train_and_val_loaders(size: int, rank: int, world_size: int, batch_size: int = 4):
    return loaders.build_loaders(numbered(size), numbered(size), batch_size, 0, 7, env_of(rank, world_size))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("size", [1, 5, 13, 64])
def test_validation_shards_hold_every_sample_exactly_once_without_padding(size, world_size):
    seen = []
    for rank in range(world_size):
        _, val_loader = train_and_val_loaders(size, rank, world_size)
        seen += samples_seen(val_loader)

    assert sorted(seen) == list(range(size))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_dealt_batches_give_every_index_once_for_odd_sizes(world_size):
    for size in (0, 1, 2, 7, 11, 101):
        dealt = [DealtBatches(size, 4, rank, world_size) for rank in range(world_size)]
        assert sorted(i for batches in dealt for batch in batches for i in batch) == list(range(size))
        assert sum(batches.size_of(number) for batches in dealt for number in batches.numbers) == size


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_validation_batch_is_the_same_whatever_the_number_of_processes(world_size):
    size = 37  # no number of processes divides it, nor the batches
    alone = list(DealtBatches(size, 5))
    dealt = {number: batch for rank in range(world_size) for number, batch in zip(
        DealtBatches(size, 5, rank, world_size).numbers, DealtBatches(size, 5, rank, world_size), strict=True)}  # fmt: skip

    assert [dealt[number] for number in sorted(dealt)] == alone
    assert alone[-1] == [35, 36]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_training_shards_together_cover_the_dataset_every_epoch(world_size):
    size = 50
    for epoch in (1, 2, 3):
        shards = []
        for rank in range(world_size):
            train_loader, _ = train_and_val_loaders(size, rank, world_size)
            loaders.train_sampler(train_loader).set_epoch(epoch)
            shards.append(samples_seen(train_loader))

        # Every rank runs the same number of steps, or DDP would wait forever for the shorter one.
        assert len({len(shard) for shard in shards}) == 1
        assert set().union(*shards) == set(range(size))
        padding = len(shards[0]) * world_size - size
        assert 0 <= padding < world_size


def test_training_order_changes_every_epoch_and_is_the_same_in_every_process():
    size, world_size = 40, 2
    orders = {}
    for epoch in (1, 2):
        for rank in range(world_size):
            for attempt in ("first process", "restarted process"):
                train_loader, _ = train_and_val_loaders(size, rank, world_size)
                loaders.train_sampler(train_loader).set_epoch(epoch)
                orders[epoch, rank, attempt] = samples_seen(train_loader)

    for rank in range(world_size):
        assert orders[1, rank, "first process"] == orders[1, rank, "restarted process"]
        assert orders[1, rank, "first process"] != orders[2, rank, "first process"]
    assert orders[1, 0, "first process"] != sorted(orders[1, 0, "first process"])
