"""The task: image classification. With model.py and data.py, the whole of what this project learns.

Edit these functions (and the two constants) for a task of your own; the loops, checkpoints,
predict.py and the notebook call nothing else. Every batch arrives as the loader made it
(here a pair: images, labels), already on the model's device, in the run's precision.
"""

import numpy as np
{# torch or paddle: both spell what this file calls alike #}import {{ cookiecutter.framework | replace("pytorch", "torch") }}.nn.functional as F

from .submission import image_ids, write_csv

BEST_METRIC = "acc"  # the metric of metrics() that picks checkpoints/best.*
BEST_MODE = "max"  # "max": higher is better; "min": lower is better


def training_loss(model, batch):
    """The batch's mean loss, a scalar: what training minimises."""
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def validation_step(model, batch) -> tuple[dict, dict]:
    """What one validation batch adds: (sums, per_sample).

    sums: numbers or arrays added over every batch of every rank (in float64), e.g. a count of
    correct answers or a confusion matrix. per_sample: arrays whose first dimension is the
    batch's samples, gathered in dataset order for metrics that need every sample (an AUC).
    """
    images, labels = batch
    logits = model(images).float()
    loss = F.cross_entropy(logits, labels, reduction="sum")
    return {"loss": loss, "correct": (logits.argmax(1) == labels).sum()}, {}


def metrics(sums: dict, per_sample: dict, count: int) -> dict:
    """The validation metrics from the whole set's sums and per-sample arrays (numpy); `count` samples.
    Must hold "loss" and BEST_METRIC; each becomes val_<name> in metrics.jsonl."""
    return {"loss": sums["loss"] / count, "acc": sums["correct"] / count}


def predict_step(model, batch) -> list:
    """One row per input of the batch (predict.py's, the notebook's): the class index and its probability."""
    return rows_from_outputs(predict_outputs(model, batch))


def predict_outputs(model, batch) -> np.ndarray:
    """What predict.py averages over several checkpoints and test-time views (numpy, a row per input): here each
    input's class probabilities."""
    return model(batch).float().softmax(1).cpu().numpy()


def rows_from_outputs(outputs: np.ndarray) -> list:
    """predict_step()'s rows from class probabilities (one model's, or several averaged): the class index and its
    probability."""
    return [(int(row.argmax()), float(row.max())) for row in outputs]


def test_time_views(model, batch) -> list[np.ndarray]:
    """predict.py --tta: predict_outputs() of each view of the batch, in the inputs' own frame: the images as they
    are, and flipped left to right."""
    return [predict_outputs(model, batch), predict_outputs(model, batch.flip(-1))]


def write_predictions(output: str | None, keys: list, rows: list, description: dict, options) -> str:
    """predict.py's file from every input's row, in the order of `keys` (data.build_predict_set()'s), and its
    path: a CSV `image,label` (--probabilities: and its probability), or in --sample-submission's form."""
    output = output or "predictions.csv"
    classes = description.get("classes")
    labels = [classes[label] if classes else str(label) for label, _ in rows]
    chances = [chance for _, chance in rows] if getattr(options, "probabilities", False) else None
    # A sample submission names an image by its path, its file name, or its file name without the extension.
    ids = [image_ids(key) for key in keys]
    write_csv(output, ["image", "label"], keys, labels, chances, getattr(options, "sample_submission", None), ids)
    return output
