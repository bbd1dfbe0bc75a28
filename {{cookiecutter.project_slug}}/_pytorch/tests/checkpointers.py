"""A Checkpointer of a small model, a few training steps for it (averaged ones too), a draw from the random streams it
saves and comparisons of weights and optimizers, for test_checkpoint.py and for test_checkpoint_resume.py, which asks
the same of both frameworks' checkpoints (test_evaluate.py compares weights with it too)."""

import random

import numpy as np
import torch
import torch.nn.functional as F
from conftest import ACC, save_epoch
from torch import nn

from {{ cookiecutter.project_slug }} import engine
from {{ cookiecutter.project_slug }}.checkpoint import Checkpointer
from {{ cookiecutter.project_slug }}.distributed import DistEnv

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
LAST_FILES = ["last.pt"]  # what a save's last checkpoint is made of
RANKS_DISAGREE = "ranks found different checkpoints"  # what a resume that ranks would take from different saves says


def build_checkpointer(
    directory, out_features: int = 3, model: nn.Module | None = None, env: DistEnv = CPU, lr: float = 0.1
) -> Checkpointer:
    model = model or nn.Linear(4, out_features)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    schedule = engine.cosine_schedule(optimizer, 10)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return Checkpointer(directory, env, model, optimizer, schedule, scaler, best=ACC)


def take_steps(checkpointer: Checkpointer, steps: int = 3) -> None:
    """A few optimizer and scheduler steps, so there is momentum and a schedule position to lose."""
    for _ in range(steps):
        inputs, labels = torch.randn(8, 4), torch.randint(0, 3, (8,))
        loss = F.cross_entropy(checkpointer.model(inputs), labels)
        checkpointer.optimizer.zero_grad()
        loss.backward()
        checkpointer.optimizer.step()
        checkpointer.schedule.advance(checkpointer.schedule.position + 0.1)  # a tenth of an epoch a step


def take_averaged_steps(checkpointer: Checkpointer, steps: int = 3) -> None:
    """Training steps, each followed by --ema's update of the averages, as engine.train_one_epoch() takes them."""
    for _ in range(steps):
        take_steps(checkpointer, 1)
        checkpointer.ema.update()


def draw_random_numbers() -> tuple:
    """A draw from each random stream a checkpoint keeps: Python's, numpy's and PyTorch's."""
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def weights_of(model: nn.Module) -> dict:
    """A copy of the model's state dict, which later steps leave as it is."""
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def assert_same_weights(left: dict, right: dict) -> None:
    """The same names, and tensors equal to the last bit."""
    assert left.keys() == right.keys()
    for key in left:
        torch.testing.assert_close(left[key], right[key], rtol=0, atol=0)


def averages_of(checkpointer: Checkpointer) -> dict:
    """A copy of the averaged weights (--ema's), which later steps leave as it is."""
    return {name: average.detach().clone() for name, average in checkpointer.ema.averages.items()}


def assert_same_optimizer(resumed: Checkpointer, saved: Checkpointer) -> None:
    """The resumed optimizer's settings, momentum buffers and rate are the saved one's."""
    restored, original = resumed.optimizer.state_dict(), saved.optimizer.state_dict()
    assert restored["param_groups"] == original["param_groups"]
    for index, buffers in original["state"].items():
        assert_same_weights(restored["state"][index], buffers)
    assert resumed.optimizer.param_groups[0]["lr"] == saved.optimizer.param_groups[0]["lr"]


def learning_rates(directory, total_epochs: int, run_epochs: range, resume: str) -> list[float]:
    """The rate of each epoch's optimizer step, as run.py builds, resumes and steps the schedule (a run's saves in
    `directory`)."""
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule = engine.cosine_schedule(optimizer, total_epochs)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    checkpointer = Checkpointer(directory, CPU, model, optimizer, schedule, scaler)
    checkpointer.resume(resume)  # which also puts the schedule's rate back
    rates = []
    for epoch in run_epochs:
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.advance(epoch)
        save_epoch(checkpointer, epoch, 0.0, False)
    return rates
