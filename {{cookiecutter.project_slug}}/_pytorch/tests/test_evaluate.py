"""Validation: the task's metrics over the whole validation set, each sample once, and the model left untouched.

The tests give the engine a small classification task of their own, so they test the loop whatever task
this project was baked with."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from {{ cookiecutter.project_slug }} import engine, loaders, seam
from {{ cookiecutter.project_slug }}.distributed import DistEnv

CPU = torch.device("cpu")


def validation_step(model, batch) -> tuple[dict, dict]:
    inputs, labels = batch
    logits = model(inputs).float()
    sums = {"loss": F.cross_entropy(logits, labels, reduction="sum"), "correct": (logits.argmax(dim=1) == labels).sum()}
    return sums, {"labels": labels}


def metrics(sums: dict, per_sample: dict, count: int) -> dict:
    return {"loss": sums["loss"] / count, "acc": sums["correct"] / count, "labels_seen": len(per_sample["labels"])}


ACCURACY_TASK = seam.Task(
    task=SimpleNamespace(BEST_METRIC="acc", BEST_MODE="max", validation_step=validation_step, metrics=metrics)
)


def env_of(rank: int, world_size: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=CPU)


def test_evaluate_reports_loss_and_accuracy_over_every_validation_sample_once():
    # The "model" passes its input through, so the logits, hence loss and accuracy, are known.
    logits = torch.tensor([[2.0, 0.0, 0.0]] * 4 + [[0.0, 3.0, 0.0]] * 3 + [[0.0, 0.0, 1.0]] * 3)
    labels = torch.tensor([0, 0, 1, 2, 1, 1, 1, 2, 2, 0])
    val_set = TensorDataset(logits, labels)
    env = env_of(0, 1)
    _, val_loader = loaders.build_loaders(val_set, val_set, 4, 0, 0, env)  # 10 samples: batches of 4, 4 and 2

    stats = engine.evaluate(nn.Identity(), val_loader, env, ACCURACY_TASK)

    assert stats["samples"] == 10
    assert stats["labels_seen"] == 10
    assert stats["acc"] == pytest.approx(7 / 10)
    assert stats["loss"] == pytest.approx(F.cross_entropy(logits, labels).item())


def test_evaluate_leaves_the_model_in_eval_mode_and_does_not_train_it():
    model = nn.Linear(3, 2)
    weights = model.weight.detach().clone()
    val_set = TensorDataset(torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 0, 1]))
    env = env_of(0, 1)
    _, val_loader = loaders.build_loaders(val_set, val_set, 4, 0, 0, env)

    engine.evaluate(model, val_loader, env, ACCURACY_TASK)

    assert not model.training
    assert torch.equal(model.weight, weights)
    assert model.weight.grad is None
