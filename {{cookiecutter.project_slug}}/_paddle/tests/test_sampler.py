"""How the data is split across ranks: training shards reshuffle every epoch, validation counts each sample once."""

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from paddle import nn
from paddle.io import TensorDataset

from {{ cookiecutter.project_slug }} import engine, loaders
from {{ cookiecutter.project_slug }}.distributed import DistEnv


def env_of(rank: int, world_size: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world_size, device="cpu")


def numbered(size: int) -> TensorDataset:
    """Sample i is the number i, so a batch tells which samples it holds."""
    return TensorDataset([paddle.arange(size), paddle.zeros([size], dtype="int64")])


def samples_seen(loader) -> list[int]:
    return [int(i) for batch, _ in loader for i in batch.numpy()]


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
def test_shard_sampler_gives_every_index_once_for_odd_sizes(world_size):
    for size in (0, 1, 2, 7, 11, 101):
        shards = [list(loaders.ShardSampler(size, env_of(rank, world_size))) for rank in range(world_size)]
        assert sorted(i for shard in shards for i in shard) == list(range(size))
        assert sum(len(loaders.ShardSampler(size, env_of(r, world_size))) for r in range(world_size)) == size


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_training_shards_together_cover_the_dataset_every_epoch(world_size):
    size = 50
    for epoch in (1, 2, 3):
        shards = []
        for rank in range(world_size):
            train_loader, _ = train_and_val_loaders(size, rank, world_size)
            loaders.train_sampler(train_loader).set_epoch(epoch)
            shards.append(samples_seen(train_loader))

        # Every rank runs the same number of steps, or DataParallel would wait forever for the shorter one.
        assert len({len(shard) for shard in shards}) == 1
        assert set().union(*shards) == set(range(size))
        padding = len(shards[0]) * world_size - size
        assert 0 <= padding < world_size
        assert padding == train_loader.batch_sampler.total_size - size  # what train_samples subtracts


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


def test_validation_counts_every_sample_once_in_loss_and_accuracy():
    # The "model" passes its input through, so the logits, hence loss and accuracy, are known.
    logits = np.array([[2.0, 0.0, 0.0]] * 4 + [[0.0, 3.0, 0.0]] * 3 + [[0.0, 0.0, 1.0]] * 3, dtype="float32")
    labels = np.array([0, 0, 1, 2, 1, 1, 1, 2, 2, 0])
    val_set = TensorDataset([paddle.to_tensor(logits), paddle.to_tensor(labels)])
    env = env_of(0, 1)
    _, val_loader = loaders.build_loaders(val_set, val_set, 4, 0, 0, env)  # 10 samples: batches of 4, 4 and 2

    stats = engine.evaluate(nn.Identity(), val_loader, env, use_amp=False)

    assert stats["samples"] == 10
    assert stats["acc"] == pytest.approx(7 / 10)
    expected_loss = F.cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels)).item()
    assert stats["loss"] == pytest.approx(expected_loss, rel=1e-6)


def test_evaluate_leaves_the_model_in_eval_mode_and_does_not_train_it():
    model = nn.Linear(3, 2)
    weights = model.weight.numpy().copy()
    val_set = TensorDataset([paddle.randn([6, 3]), paddle.to_tensor([0, 1, 0, 1, 0, 1])])
    env = env_of(0, 1)
    _, val_loader = loaders.build_loaders(val_set, val_set, 4, 0, 0, env)

    engine.evaluate(model, val_loader, env, use_amp=False)

    assert not model.training
    assert np.array_equal(model.weight.numpy(), weights)
    assert model.weight.grad is None
