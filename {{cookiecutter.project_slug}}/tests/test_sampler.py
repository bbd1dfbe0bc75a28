"""How the data is split across ranks: training shards reshuffle every epoch, validation counts each sample once.

Framework-free: the loaders take any map-style dataset (here a list) and read only the rank,
the world size and whether a GPU is in use from the environment.
"""

from collections import Counter
from types import SimpleNamespace

import pytest

from {{ cookiecutter.project_slug }} import loaders
from {{ cookiecutter.project_slug }}.batches import DealtBatches


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


def shards(size: int, world_size: int, epoch: int, consumed: int = 0, batch_size: int = 4) -> list[list[list[int]]]:
    """Each rank's training batches of `epoch`, after the first `consumed` samples of the epoch's order."""
    batches = []
    for rank in range(world_size):
        train_loader, _ = train_and_val_loaders(size, rank, world_size, batch_size)
        sampler = loaders.train_sampler(train_loader)
        sampler.set_epoch(epoch)
        sampler.consumed = consumed
        batches.append([[int(i) for i in batch] for batch, _ in train_loader])
    return batches


@pytest.mark.parametrize("before, after", [(2, 1), (2, 3), (3, 2), (1, 4)])
def test_a_stopped_epoch_goes_on_on_another_number_of_processes_with_no_sample_twice_and_none_left_out(before, after):
    size, steps_done = 53, 3  # no number of processes divides the set
    trained = [i for rank in shards(size, before, epoch=2) for batch in rank[:steps_done] for i in batch]
    sampler = loaders.train_sampler(train_and_val_loaders(size, 0, before)[0])
    consumed = sampler.consumed_after(steps_done)

    rest = shards(size, after, epoch=2, consumed=consumed)
    rest_samples = [i for rank in rest for batch in rank for i in batch]
    padding = len(rest_samples) - (size - consumed)

    assert len(trained) == consumed
    assert len({sum(len(batch) for batch in rank) for rank in rest}) == 1  # every rank takes as many samples
    assert 0 <= padding < after
    times = Counter(trained + rest_samples)
    assert sorted(times) == list(range(size))  # none left out
    assert sum(count - 1 for count in times.values()) == padding  # none twice, but the padding
    resumed = loaders.train_sampler(train_and_val_loaders(size, 0, after)[0])
    resumed.consumed = consumed
    assert resumed.padding == padding  # what the epoch's count of distinct samples leaves out


def test_a_stopped_epoch_on_the_same_number_of_processes_goes_on_with_the_batches_it_would_have_had():
    size, world_size, steps_done = 53, 2, 3
    whole = shards(size, world_size, epoch=4)
    consumed = loaders.train_sampler(train_and_val_loaders(size, 0, world_size)[0]).consumed_after(steps_done)

    assert shards(size, world_size, epoch=4, consumed=consumed) == [rank[steps_done:] for rank in whole]
