"""The task: regression on a table. With model.py and data.py, the whole of what this project learns.

Edit these functions (and the two constants) for a task of your own; the loops, checkpoints,
predict.py and the notebook call nothing else. Every batch arrives as the loader made it
(here a pair: standardised features, targets in their own units), already on the model's
device, in the run's precision.

The same file serves PyTorch and Paddle: what it does to tensors (arithmetic, .abs(), .float(),
.cpu().numpy()) both frameworks spell alike. Add the framework's import when yours needs more.

The model answers in the target's units (model.py); the loss divides the error by the training
target's standard deviation (the model gives both errors): training sees a standardised target, so a
target in the thousands trains as well as one near 1, while the metrics stay in the target's units.
"""

import math

import numpy as np

from .submission import write_csv

BEST_METRIC = "rmse"  # the metric of metrics() that picks checkpoints/best.*
BEST_MODE = "min"  # "max": higher is better; "min": lower is better


def standardised_error(model, batch) -> tuple:
    """The batch's errors (prediction - target) in the target's units (float32), and in standard deviations: the
    model's, which knows the training target's."""
    features, target = batch
    return model(features, target)


def training_loss(model, batch):
    """The batch's mean squared error on the standardised scale, a scalar: what training minimises."""
    _, standardised = standardised_error(model, batch)
    return (standardised**2).mean()


def validation_step(model, batch) -> tuple[dict, dict]:
    """What one validation batch adds: (sums, per_sample).

    sums: numbers or arrays added over every batch of every rank (in float64): here the loss (standardised)
    and the squared and absolute errors in the target's units. per_sample: arrays whose first dimension is
    the batch's samples, gathered in dataset order for metrics that need every sample (none here).
    """
    error, standardised = standardised_error(model, batch)
    return {"loss": (standardised**2).sum(), "squared_error": (error**2).sum(), "absolute_error": error.abs().sum()}, {}


def metrics(sums: dict, per_sample: dict, count: int) -> dict:
    """The validation metrics from the whole set's sums and per-sample arrays (numpy); `count` samples.
    Must hold "loss" and BEST_METRIC; each becomes val_<name> in metrics.jsonl. rmse and mae are in the
    target's units."""
    return {
        "loss": sums["loss"] / count,
        "rmse": math.sqrt(sums["squared_error"] / count),
        "mae": sums["absolute_error"] / count,
    }


def predict_step(model, batch) -> list:
    """One row per input of the batch (predict.py's, the notebook's): the predicted target, in its units."""
    return rows_from_outputs(predict_outputs(model, batch))


def predict_outputs(model, batch) -> np.ndarray:
    """What predict.py averages over several checkpoints (numpy, a value per input): the predicted target."""
    return model(batch).float().cpu().numpy()


def rows_from_outputs(outputs: np.ndarray) -> list:
    """predict_step()'s rows from predicted targets (one model's, or several averaged)."""
    return outputs.tolist()


def write_predictions(output: str | None, keys: list, rows: list, description: dict, options) -> str:
    """predict.py's file from every input's row, in the order of `keys` (data.build_predict_set()'s: the input's
    ids, or row numbers), and its path: a CSV `id,<target>` (or in --sample-submission's form)."""
    output = output or "predictions.csv"
    values = [str(np.float32(value)) for value in rows]  # the shortest decimal that reads back as the prediction
    header = ["id", description.get("target", "target")]
    write_csv(output, header, keys, values, sample=getattr(options, "sample_submission", None))
    return output
