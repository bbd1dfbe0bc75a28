"""Validation: the task's metrics over the whole validation set, each sample once, and the model left untouched.

The tests give the engine a small classification task of their own (its validation step in validating.py, one per
framework), so they test the loop whatever task this project was baked with."""

from types import SimpleNamespace

import numpy as np
import pytest
from checkpointers import CPU, assert_same_weights, weights_of
from validating import cross_entropy, dataset, nn, validation_step

from {{ cookiecutter.project_slug }} import engine, loaders, seam


def metrics(sums: dict, per_sample: dict, count: int) -> dict:
    return {"loss": sums["loss"] / count, "acc": sums["correct"] / count, "labels_seen": len(per_sample["labels"])}


ACCURACY_TASK = seam.Task(
    task=SimpleNamespace(BEST_METRIC="acc", BEST_MODE="max", validation_step=validation_step, metrics=metrics)
)


def evaluate(model, val_set) -> dict:
    """engine.evaluate() of `model` over `val_set` in batches of 4, in one process on the CPU."""
    _, val_loader = loaders.build_loaders(val_set, val_set, 4, 0, 0, CPU)
    return engine.evaluate(model, val_loader, CPU, ACCURACY_TASK)


def test_evaluate_reports_loss_and_accuracy_over_every_validation_sample_once():
    # The "model" passes its input through, so the logits, hence loss and accuracy, are known.
    logits = np.array([[2.0, 0.0, 0.0]] * 4 + [[0.0, 3.0, 0.0]] * 3 + [[0.0, 0.0, 1.0]] * 3, dtype=np.float32)
    labels = np.array([0, 0, 1, 2, 1, 1, 1, 2, 2, 0])

    stats = evaluate(nn.Identity(), dataset(logits, labels))  # 10 samples: batches of 4, 4 and 2

    assert stats["samples"] == 10
    assert stats["labels_seen"] == 10
    assert stats["acc"] == pytest.approx(7 / 10)
    assert stats["loss"] == pytest.approx(cross_entropy(logits, labels), rel=1e-6)


def test_evaluate_leaves_the_model_in_eval_mode_and_does_not_train_it():
    model = nn.Linear(3, 2)
    weights = weights_of(model)
    inputs = np.random.default_rng(0).standard_normal((6, 3), dtype=np.float32)

    evaluate(model, dataset(inputs, np.array([0, 1, 0, 1, 0, 1])))

    assert not model.training
    assert_same_weights(weights_of(model), weights)
    assert model.weight.grad is None
