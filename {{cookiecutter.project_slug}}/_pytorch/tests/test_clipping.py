"""--clip-grad-norm: no optimizer step moves the weights further than the clipped gradient allows."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from curves import CPU
from torch import nn
from torch.utils.data import TensorDataset

from {{ cookiecutter.project_slug }} import engine, loaders, seam
from {{ cookiecutter.project_slug }}.distributed import DistEnv
from {{ cookiecutter.project_slug }}.preemption import EpochProgress, StopRequest


def cross_entropy(model, batch) -> torch.Tensor:
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


CLASSIFICATION = seam.Task(task=SimpleNamespace(BEST_METRIC="loss", BEST_MODE="min", training_loss=cross_entropy))


def step_length(clip_grad_norm: float | None) -> float:
    """The global norm of one plain SGD step (learning rate 1) on inputs large enough for a large gradient."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    before = [parameter.detach().clone() for parameter in model.parameters()]
    data = TensorDataset(100 * torch.randn(16, 8), torch.randint(0, 4, (16,)))
    env = DistEnv(0, 0, 1, CPU)
    loader, _ = loaders.build_loaders(data, data, 16, 0, 0, env)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    engine.train_one_epoch(
        model, loader, optimizer, engine.grad_scaler(None), env, 1, EpochProgress(), StopRequest(), CLASSIFICATION,
        clip_grad_norm=clip_grad_norm,
    )  # fmt: skip
    moves = [
        (parameter.detach() - start).flatten() for parameter, start in zip(model.parameters(), before, strict=True)
    ]
    return float(torch.cat(moves).norm())


def test_clipping_scales_a_large_gradient_down_to_the_norm_asked_for():
    assert step_length(None) > 10
    assert step_length(0.5) == pytest.approx(0.5, rel=1e-4)


def test_clipping_leaves_a_gradient_below_the_norm_as_it_is():
    assert step_length(1e6) == pytest.approx(step_length(None), rel=1e-6)
