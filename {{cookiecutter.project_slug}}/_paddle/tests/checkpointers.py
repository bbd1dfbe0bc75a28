"""A Checkpointer of a small model, a few training steps for it (averaged ones too), a draw from the random streams it
saves and comparisons of weights and optimizers, for test_checkpoint.py and for test_checkpoint_resume.py, which asks
the same of both frameworks' checkpoints (test_evaluate.py compares weights with it too)."""

import random

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from conftest import ACC, save_epoch
from paddle import nn

from {{ cookiecutter.project_slug }} import engine
from {{ cookiecutter.project_slug }}.checkpoint import Checkpointer
from {{ cookiecutter.project_slug }}.distributed import DistEnv

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device="cpu")
LAST_FILES = ["last.pdopt", "last.pdparams"]  # what a save's last checkpoint is made of (and last.json, its data)
RANKS_DISAGREE = "different epochs"  # what a resume that ranks would take from different saves says


def build_checkpointer(
    directory, out_features: int = 3, wrap=lambda model: model, env: DistEnv = CPU, lr: float = 0.1
) -> Checkpointer:
    # Paddle keys optimizer state by parameter names: start them afresh, as in a new process.
    with paddle.utils.unique_name.guard():
        model = wrap(nn.Linear(4, out_features))
        optimizer = paddle.optimizer.Momentum(lr, momentum=0.9, parameters=model.parameters())
        schedule = engine.cosine_schedule(optimizer, 10)
    return Checkpointer(directory, env, model, optimizer, schedule, paddle.amp.GradScaler(enable=False), best=ACC)


def take_steps(checkpointer: Checkpointer, steps: int = 3, seed: int = 0) -> None:
    """A few optimizer and scheduler steps, so there is momentum and a schedule position to lose."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        inputs = paddle.to_tensor(rng.standard_normal((8, 4), dtype=np.float32))
        labels = paddle.to_tensor(rng.integers(0, 3, 8))
        F.cross_entropy(checkpointer.model(inputs), labels).backward()
        with paddle.utils.unique_name.guard():  # the first step names the momentum buffers, as in a new process
            checkpointer.optimizer.step()
        checkpointer.optimizer.clear_grad()
        checkpointer.schedule.advance(checkpointer.schedule.position + 0.1)  # a tenth of an epoch a step


def take_averaged_steps(checkpointer: Checkpointer, steps: int = 3, seed: int = 0) -> None:
    """Training steps, each followed by --ema's update of the averages, as engine.train_one_epoch() takes them."""
    for step in range(steps):
        take_steps(checkpointer, 1, seed=seed + step)
        checkpointer.ema.update()


def draw_random_numbers() -> tuple:
    """A draw from each random stream a checkpoint keeps: Python's, numpy's and Paddle's."""
    return random.random(), float(np.random.rand()), paddle.rand([3]).tolist()


def weights_of(model) -> dict:
    return {key: value.numpy().copy() for key, value in model.state_dict().items()}


def assert_same_weights(left: dict, right: dict) -> None:
    assert left.keys() == right.keys()
    for key in left:
        np.testing.assert_array_equal(np.asarray(left[key]), np.asarray(right[key]))


def averages_of(checkpointer: Checkpointer) -> dict:
    """A copy of the averaged weights (--ema's), which later steps leave as it is."""
    return {name: average.numpy().copy() for name, average in checkpointer.ema.averages.items()}


def assert_same_optimizer(resumed: Checkpointer, saved: Checkpointer) -> None:
    """The resumed optimizer's rate is the saved one's, and its momentum and schedule came back: the next steps
    (which both take) match the uninterrupted run's exactly."""
    assert resumed.optimizer.get_lr() == saved.optimizer.get_lr()
    take_steps(saved, seed=9)
    take_steps(resumed, seed=9)
    assert_same_weights(weights_of(resumed.model), weights_of(saved.model))


def learning_rates(directory, total_epochs: int, run_epochs: range, resume: str) -> list[float]:
    """The rate of each epoch's optimizer step, as run.py builds, resumes and steps the schedule (a run's saves in
    `directory`); the step really applies it."""
    model = nn.Linear(4, 3)
    optimizer = paddle.optimizer.SGD(0.1, parameters=model.parameters())  # a step moves by -lr x grad
    schedule = engine.cosine_schedule(optimizer, total_epochs)
    checkpointer = Checkpointer(directory, CPU, model, optimizer, schedule, paddle.amp.GradScaler(enable=False))
    checkpointer.resume(resume)  # which also puts the schedule's rate back
    rates = []
    for epoch in run_epochs:
        before = model.bias.numpy().copy()
        model.bias.sum().backward()  # a gradient of 1
        optimizer.step()
        optimizer.clear_grad()
        applied = float(before[0] - model.bias.numpy()[0])
        assert applied == pytest.approx(optimizer.get_lr(), rel=1e-4)  # what run.py records is what trained
        rates.append(optimizer.get_lr())
        schedule.advance(epoch)
        save_epoch(checkpointer, epoch, 0.0, False)
    return rates
