"""The scaffold's own loop trains the same model however the global batch is split, and whether each rank holds
the whole model (DDP) or a shard of it (FSDP).

Two ranks with batch b, one process with batch b and 2 accumulation steps, and
two ranks with batch b/2 and 2 accumulation steps all take the same SGD steps
as one process with batch 2b: DistributedSampler draws one permutation per
epoch on every rank and rank r takes every other sample of it, so step k
covers the same 2b samples in every set-up. The model has no batch norm or
dropout, whose results depend on how a batch is split. The loop trains it with a task
of the test's own (the cross-entropy of (inputs, labels) batches), whatever the project's task.
"""

import os
import socket
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import assert_really_trained, assert_trained_alike, rank_results, save_rank_result
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import TensorDataset

from {{ cookiecutter.project_slug }} import distributed, engine, loaders, seam
from {{ cookiecutter.project_slug }}.preemption import EpochProgress, StopRequest

pytestmark = pytest.mark.slow

SAMPLES, FEATURES, CLASSES = 64, 8, 4
B = 8  # per-process batch of the two-rank run; 64 samples = 4 steps of 2B per epoch
EPOCHS = 2


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(123)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    return TensorDataset(inputs, labels)


def small_mlp() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights in every set-up
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))


def cross_entropy(model, batch) -> torch.Tensor:
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


CLASSIFICATION = seam.Task(task=SimpleNamespace(BEST_METRIC="loss", BEST_MODE="min", training_loss=cross_entropy))


def train(
    batch_size: int, grad_accum: int, strategy: str = "ddp", recompute: bool = False, reshard: bool = True
) -> dict:
    """Train with the project's loaders, model wrapper (DDP, or FSDP's shards) and loop; return parameters and
    per-epoch stats."""
    env = distributed.setup("cpu", timeout_s=120)
    try:
        train_loader, _ = loaders.build_loaders(dataset(), dataset(), batch_size, 0, 5, env)
        network = small_mlp()
        forwards = count_forwards(network)
        model = distributed.wrap_model(
            network, env, strategy=strategy, activation_checkpointing=recompute, reshard_after_forward=reshard
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        scaler = engine.grad_scaler(False)
        epochs = [
            engine.train_one_epoch(
                model,
                train_loader,
                optimizer,
                scaler,
                env,
                epoch,
                EpochProgress(),
                StopRequest(),
                CLASSIFICATION,
                grad_accum,
            )  # fmt: skip
            for epoch in range(1, EPOCHS + 1)
        ]
        # The whole tensors on every rank (a sharded model's gathered from all of them).
        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        return {
            # Plain numpy arrays and numbers only: tensors do not travel well between processes.
            "parameters": [weight.detach().numpy().copy() for weight in weights.values()],
            "losses": np.array([stats["loss"] for stats in epochs]),
            "samples": np.array([stats["samples"] for stats in epochs]),
            "forwards": forwards[0],
        }
    finally:
        distributed.cleanup()


def count_forwards(network: nn.Module) -> list[int]:
    """The forward passes of the network's first layer, counted as they happen (a recomputation counts)."""
    forwards = [0]
    network[0].register_forward_pre_hook(lambda module, inputs: forwards.__setitem__(0, forwards[0] + 1))
    return forwards


def rank_worker(
    rank: int, world_size: int, port: int, batch_size: int, grad_accum: int, strategy: str, recompute: bool,
    reshard: bool, out_dir: str,
) -> None:  # fmt: skip
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    save_rank_result(out_dir, rank, train(batch_size, grad_accum, strategy, recompute, reshard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_in_ranks(
    tmp_path, world_size: int, batch_size: int, grad_accum: int, strategy: str = "ddp", recompute: bool = False,
    reshard: bool = True,
) -> list[dict]:  # fmt: skip
    """Train in world_size spawned processes joined by gloo; every rank's result."""
    out_dir = tmp_path / f"w{world_size}_b{batch_size}_a{grad_accum}_{strategy}_{recompute}_{reshard}"
    out_dir.mkdir()
    arguments = (world_size, free_port(), batch_size, grad_accum, strategy, recompute, reshard, str(out_dir))
    mp.spawn(rank_worker, args=arguments, nprocs=world_size)
    return rank_results(out_dir, world_size)


def train_here(batch_size: int, grad_accum: int) -> dict:
    """Train in this process, as `python run.py` does: no launcher variables, no process group."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS"):
            patch.delenv(name, raising=False)
        return train(batch_size, grad_accum)


@pytest.fixture(scope="module")
def one_process_with_batch_2b() -> dict:
    return train_here(2 * B, grad_accum=1)


def assert_same_training(result: dict, reference: dict) -> None:
    assert_trained_alike(result, reference, [SAMPLES] * EPOCHS, rtol=1e-4, atol=1e-5)


def test_reference_run_really_trains(one_process_with_batch_2b):
    assert_really_trained(one_process_with_batch_2b, [start.detach().numpy() for start in small_mlp().parameters()])


def test_two_ranks_with_batch_b_match_one_process_with_batch_2b(tmp_path, one_process_with_batch_2b):
    ranks = train_in_ranks(tmp_path, world_size=2, batch_size=B, grad_accum=1)

    for result in ranks:
        assert_same_training(result, one_process_with_batch_2b)


def test_one_process_accumulating_two_batches_of_b_matches_one_batch_of_2b(one_process_with_batch_2b):
    assert_same_training(train_here(B, grad_accum=2), one_process_with_batch_2b)


def test_two_ranks_accumulating_without_sync_match_one_process_with_batch_2b(tmp_path, one_process_with_batch_2b):
    ranks = train_in_ranks(tmp_path, world_size=2, batch_size=B // 2, grad_accum=2)

    for result in ranks:
        assert_same_training(result, one_process_with_batch_2b)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_two_ranks_sharding_the_model_with_fsdp_match_one_process_with_batch_2b(
    tmp_path, one_process_with_batch_2b, grad_accum
):
    ranks = train_in_ranks(tmp_path, world_size=2, batch_size=B // grad_accum, grad_accum=grad_accum, strategy="fsdp")

    for result in ranks:
        assert_same_training(result, one_process_with_batch_2b)


def test_fsdp_keeping_the_gathered_parameters_until_backward_trains_the_same(tmp_path, one_process_with_batch_2b):
    for result in train_in_ranks(tmp_path, world_size=2, batch_size=B, grad_accum=1, strategy="fsdp", reshard=False):
        assert_same_training(result, one_process_with_batch_2b)


def test_activation_checkpointing_under_fsdp_recomputes_each_forward_and_trains_the_same(
    tmp_path, one_process_with_batch_2b
):
    kept = train_in_ranks(tmp_path, world_size=2, batch_size=B, grad_accum=1, strategy="fsdp")
    recomputed = train_in_ranks(tmp_path, world_size=2, batch_size=B, grad_accum=1, strategy="fsdp", recompute=True)

    for result in recomputed:
        assert_same_training(result, one_process_with_batch_2b)
    assert [rank["forwards"] for rank in recomputed] == [2 * rank["forwards"] for rank in kept]
