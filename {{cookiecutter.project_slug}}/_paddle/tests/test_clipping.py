"""--clip-grad-norm: no optimizer step moves the weights further than the clipped gradient allows, in every loop
the project ships (its own, and paddle.Model.fit in a paddle_api=highlevel project)."""

from types import SimpleNamespace

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from curves import CPU
from paddle import nn
from paddle.io import TensorDataset

from {{ cookiecutter.project_slug }} import engine, fit, loaders, seam
from {{ cookiecutter.project_slug }}.distributed import DistEnv
from {{ cookiecutter.project_slug }}.preemption import EpochProgress, StopRequest
from {{ cookiecutter.project_slug }}.state import TrainingState

ENV = DistEnv(0, 0, 1, CPU)


def cross_entropy(model, batch) -> paddle.Tensor:
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


CLASSIFICATION = seam.Task(task=SimpleNamespace(BEST_METRIC="loss", BEST_MODE="min", training_loss=cross_entropy))


def with_own_loop(model, loader, clip_grad_norm: float | None) -> None:
    optimizer = paddle.optimizer.SGD(learning_rate=1.0, parameters=model.parameters())
    engine.train_one_epoch(
        model, loader, optimizer, engine.grad_scaler(None), ENV, 1, EpochProgress(), StopRequest(), CLASSIFICATION,
        clip_grad_norm=clip_grad_norm,
    )  # fmt: skip


def with_fit(network, loader, clip_grad_norm: float | None) -> None:
    model = fit.paddle_model(network, loader, CLASSIFICATION)
    optimizer = paddle.optimizer.SGD(learning_rate=1.0, parameters=network.parameters())
    fit.clip_gradients(optimizer, clip_grad_norm)
    model.prepare(optimizer, fit.accumulated_loss(1))
    end_epoch = fit.EpochEnd(loader, ENV, TrainingState(), StopRequest(), lambda *_: None)
    model.fit(end_epoch.batches, epochs=1, verbose=0, callbacks=[end_epoch])


LOOPS = {"own loop": with_own_loop}
if hasattr(fit, "EpochEnd"):  # paddle_api=highlevel: fit.py runs paddle.Model.fit
    LOOPS["paddle.Model.fit"] = with_fit


def step_length(loop: str, clip_grad_norm: float | None) -> float:
    """The global norm of one plain SGD step (learning rate 1) on inputs large enough for a large gradient."""
    paddle.seed(0)
    model = nn.Linear(8, 4)
    before = [parameter.numpy().copy() for parameter in model.parameters()]
    rng = np.random.default_rng(0)
    data = TensorDataset([paddle.to_tensor(100 * rng.standard_normal((16, 8), dtype=np.float32)),
                          paddle.to_tensor(rng.integers(0, 4, 16))])  # fmt: skip
    loader, _ = loaders.build_loaders(data, data, 16, 0, 0, ENV)
    LOOPS[loop](model, loader, clip_grad_norm)
    moves = [parameter.numpy() - start for parameter, start in zip(model.parameters(), before, strict=True)]
    return float(np.sqrt(sum((move**2).sum() for move in moves)))


@pytest.mark.parametrize("loop", LOOPS)
def test_clipping_scales_a_large_gradient_down_to_the_norm_asked_for(loop):
    assert step_length(loop, None) > 10
    assert step_length(loop, 0.5) == pytest.approx(0.5, rel=1e-4)


@pytest.mark.parametrize("loop", LOOPS)
def test_clipping_leaves_a_gradient_below_the_norm_as_it_is(loop):
    assert step_length(loop, 1e6) == pytest.approx(step_length(loop, None), rel=1e-6)
