"""The project's training loop trains the same model however the global batch is split.

Every loop the project ships is checked: its own (engine.train_one_epoch) and, in a
paddle_api=highlevel project, paddle.Model.fit with its epoch callback (fit.py). Two ranks with batch b, one process with batch b and 2 accumulation steps, and
two ranks with batch b/2 and 2 accumulation steps all take the same SGD steps
as one process with batch 2b: the training sampler draws one permutation per
epoch, the same on every rank, and rank r takes every other sample of it, so
step k covers the same 2b samples in every set-up. The model has no batch
norm or dropout, whose results depend on how a batch is split. The loops train it with a
task of the test's own (the cross-entropy of (inputs, labels) batches), whatever the project's task.
"""

from types import SimpleNamespace

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
import pytest
from conftest import assert_really_trained, assert_trained_alike, rank_results, save_rank_result
from paddle import nn
from paddle.io import TensorDataset

from {{ cookiecutter.project_slug }} import distributed, engine, fit, loaders, seam
from {{ cookiecutter.project_slug }}.preemption import EpochProgress, StopRequest
from {{ cookiecutter.project_slug }}.state import TrainingState

pytestmark = pytest.mark.slow

SAMPLES, FEATURES, CLASSES = 64, 8, 4
B = 8  # per-process batch of the two-rank run; 64 samples = 4 steps of 2B per epoch
EPOCHS = 2
LAUNCHER_VARIABLES = ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_LOCAL_RANK")


def dataset() -> TensorDataset:
    rng = np.random.default_rng(123)
    inputs = rng.standard_normal((SAMPLES, FEATURES), dtype=np.float32)
    labels = rng.integers(0, CLASSES, SAMPLES)
    return TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(labels)])


def build_model() -> nn.Layer:
    paddle.seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))


def cross_entropy(model, batch) -> paddle.Tensor:
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


CLASSIFICATION = seam.Task(task=SimpleNamespace(BEST_METRIC="loss", BEST_MODE="min", training_loss=cross_entropy))


def momentum(model: nn.Layer) -> paddle.optimizer.Optimizer:
    return paddle.optimizer.Momentum(learning_rate=0.5, momentum=0.9, parameters=model.parameters())


def with_own_loop(network: nn.Layer, loader, env, grad_accum: int, strategy="ddp", clip_grad_norm=None) -> list[dict]:
    model = distributed.wrap_model(network, env, strategy=strategy)
    model, optimizer, scaler = distributed.wrap_optimizer(model, momentum(model), engine.grad_scaler(False), strategy)
    stop, clip = StopRequest(), clip_grad_norm
    return [
        engine.train_one_epoch(
            model,
            loader,
            optimizer,
            scaler,
            env,
            epoch,
            EpochProgress(),
            stop,
            CLASSIFICATION,
            grad_accum,
            clip_grad_norm=clip,
        )  # fmt: skip
        for epoch in range(1, EPOCHS + 1)
    ]


def with_fit(network: nn.Layer, loader, env, grad_accum: int) -> list[dict]:
    model = fit.paddle_model(network, loader, CLASSIFICATION)
    model.prepare(momentum(network), fit.accumulated_loss(grad_accum))
    epochs = []
    end_epoch = fit.EpochEnd(
        loader, env, TrainingState(), StopRequest(), lambda epoch, stats, started: epochs.append(stats), grad_accum
    )
    model.fit(end_epoch.batches, epochs=EPOCHS, verbose=0, accumulate_grad_batches=grad_accum, callbacks=[end_epoch])
    return epochs


LOOPS = {"own loop": with_own_loop}
if hasattr(fit, "EpochEnd"):  # paddle_api=highlevel: fit.py runs paddle.Model.fit
    LOOPS["paddle.Model.fit"] = with_fit


def train(loop: str, batch_size: int, grad_accum: int, **options) -> dict:
    """Train with the project's loaders, model wrapper and loop; return parameters and per-epoch stats."""
    env = distributed.setup("cpu", timeout_s=120)
    try:
        train_loader, _ = loaders.build_loaders(dataset(), dataset(), batch_size, 0, 5, env)
        network = build_model()
        epochs = LOOPS[loop](network, train_loader, env, grad_accum, **options)
        return {
            # Plain numpy arrays and numbers only: tensors do not travel well between processes.
            "parameters": [p.numpy().copy() for p in network.parameters()],
            "losses": np.array([stats["loss"] for stats in epochs]),
            "samples": np.array([stats["samples"] for stats in epochs]),
        }
    finally:
        distributed.cleanup()


def rank_worker(loop: str, batch_size: int, grad_accum: int, out_dir: str, options: dict) -> None:
    save_rank_result(out_dir, dist.get_rank(), train(loop, batch_size, grad_accum, **options))


def train_in_ranks(tmp_path, loop: str, world_size: int, batch_size: int, grad_accum: int, **options) -> list[dict]:
    """Train in world_size processes started by paddle.distributed.spawn, joined by gloo; every rank's result."""
    out_dir = tmp_path / f"w{world_size}_b{batch_size}_a{grad_accum}"
    out_dir.mkdir()
    # gloo, as the ranks train on CPUs (setup("cpu")): spawn's default on a GPU machine is one GPU per rank
    worker_args = (loop, batch_size, grad_accum, str(out_dir), options)
    dist.spawn(rank_worker, args=worker_args, nprocs=world_size, backend="gloo")
    return rank_results(out_dir, world_size)


def train_here(loop: str, batch_size: int, grad_accum: int, **options) -> dict:
    """Train in this process, as `python run.py` does: no launcher variables, no process group."""
    with pytest.MonkeyPatch.context() as patch:
        for name in LAUNCHER_VARIABLES:
            patch.delenv(name, raising=False)
        return train(loop, batch_size, grad_accum, **options)


@pytest.fixture(scope="module", params=LOOPS)
def loop(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def one_process_with_batch_2b(loop) -> dict:
    return train_here(loop, 2 * B, grad_accum=1)


def assert_same_training(result: dict, reference: dict) -> None:
    assert_trained_alike(result, reference, [SAMPLES] * EPOCHS, rtol=1e-5, atol=1e-6)


def test_reference_run_really_trains(one_process_with_batch_2b):
    assert_really_trained(one_process_with_batch_2b, [start.numpy() for start in build_model().parameters()])


def test_two_ranks_with_batch_b_match_one_process_with_batch_2b(tmp_path, loop, one_process_with_batch_2b):
    ranks = train_in_ranks(tmp_path, loop, world_size=2, batch_size=B, grad_accum=1)

    for result in ranks:
        assert_same_training(result, one_process_with_batch_2b)


def test_one_process_accumulating_two_batches_of_b_matches_one_batch_of_2b(loop, one_process_with_batch_2b):
    assert_same_training(train_here(loop, B, grad_accum=2), one_process_with_batch_2b)


def test_two_ranks_accumulating_without_sync_match_one_process_with_batch_2b(tmp_path, loop, one_process_with_batch_2b):
    ranks = train_in_ranks(tmp_path, loop, world_size=2, batch_size=B // 2, grad_accum=2)

    for result in ranks:
        assert_same_training(result, one_process_with_batch_2b)


@pytest.mark.parametrize("clip_grad_norm", [None, 0.05])
def test_two_ranks_sharding_the_optimizer_state_train_as_one_process_with_batch_2b(tmp_path, clip_grad_norm):
    reference = train_here("own loop", 2 * B, grad_accum=1, clip_grad_norm=clip_grad_norm)
    ranks = train_in_ranks(
        tmp_path, "own loop", 2, B // 2, grad_accum=2, strategy="sharding stage 1", clip_grad_norm=clip_grad_norm
    )

    for result in ranks:
        assert_same_training(result, reference)
    if clip_grad_norm is not None:  # the clipping changed the training: the ranks clipped by the global norm
        unclipped = train_here("own loop", 2 * B, grad_accum=1)
        assert not np.allclose(reference["parameters"][0], unclipped["parameters"][0], atol=1e-4)
