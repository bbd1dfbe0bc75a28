"""Validation: the task's metrics over the whole validation set, each sample once, and the model left untouched.

The tests give the engine a small classification task of their own, so they test the loop whatever task
this project was baked with."""

from types import SimpleNamespace

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from paddle import nn
from paddle.io import TensorDataset

from {{ cookiecutter.project_slug }} import engine, loaders, seam
from {{ cookiecutter.project_slug }}.distributed import DistEnv


def validation_step(model, batch) -> tuple[dict, dict]:
    inputs, labels = batch
    logits = model(inputs).astype("float32")
    correct = (logits.argmax(axis=1) == labels.flatten()).astype("int64").sum()
    return {"loss": F.cross_entropy(logits, labels, reduction="sum"), "correct": correct}, {"labels": labels}


def metrics(sums: dict, per_sample: dict, count: int) -> dict:
    return {"loss": sums["loss"] / count, "acc": sums["correct"] / count, "labels_seen": len(per_sample["labels"])}


ACCURACY_TASK = seam.Task(
    task=SimpleNamespace(BEST_METRIC="acc", BEST_MODE="max", validation_step=validation_step, metrics=metrics)
)


def env_of(rank: int, world_size: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world_size, device="cpu")


def test_validation_counts_every_sample_once_in_loss_and_accuracy():
    # The "model" passes its input through, so the logits, hence loss and accuracy, are known.
    logits = np.array([[2.0, 0.0, 0.0]] * 4 + [[0.0, 3.0, 0.0]] * 3 + [[0.0, 0.0, 1.0]] * 3, dtype="float32")
    labels = np.array([0, 0, 1, 2, 1, 1, 1, 2, 2, 0])
    val_set = TensorDataset([paddle.to_tensor(logits), paddle.to_tensor(labels)])
    env = env_of(0, 1)
    _, val_loader = loaders.build_loaders(val_set, val_set, 4, 0, 0, env)  # 10 samples: batches of 4, 4 and 2

    stats = engine.evaluate(nn.Identity(), val_loader, env, ACCURACY_TASK)

    assert stats["samples"] == 10
    assert stats["labels_seen"] == 10
    assert stats["acc"] == pytest.approx(7 / 10)
    expected_loss = F.cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels)).item()
    assert stats["loss"] == pytest.approx(expected_loss, rel=1e-6)


def test_evaluate_leaves_the_model_in_eval_mode_and_does_not_train_it():
    model = nn.Linear(3, 2)
    weights = model.weight.numpy().copy()
    val_set = TensorDataset([paddle.randn([6, 3]), paddle.to_tensor([0, 1, 0, 1, 0, 1])])
    env = env_of(0, 1)
    _, val_loader = loaders.build_loaders(val_set, val_set, 4, 0, 0, env)

    engine.evaluate(model, val_loader, env, ACCURACY_TASK)

    assert not model.training
    assert np.array_equal(model.weight.numpy(), weights)
    assert model.weight.grad is None
