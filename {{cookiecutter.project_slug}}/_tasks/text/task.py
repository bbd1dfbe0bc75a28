"""The task: text classification. With model.py and data.py, the whole of what this project learns.

Edit these functions (and the two constants) for a task of your own; the loops, checkpoints,
predict.py and the notebook call nothing else. Every batch arrives as data.py's collate() made it
(here a dict: input_ids, attention_mask, and labels but for predicting), already on the model's
device, in the run's precision.
"""

import numpy as np
{# torch or paddle: both spell what this file calls alike #}import {{ cookiecutter.framework | replace("pytorch", "torch") }}.nn.functional as F

from .submission import write_csv

BEST_METRIC = "auc"  # the metric of metrics() that picks checkpoints/best.*
BEST_MODE = "max"  # "max": higher is better; "min": lower is better


def logits_of(model, batch):
    return model(batch["input_ids"], batch["attention_mask"])


def training_loss(model, batch):
    """The batch's mean loss, a scalar: what training minimises."""
    return F.cross_entropy(logits_of(model, batch), batch["labels"])


def validation_step(model, batch) -> tuple[dict, dict]:
    """What one validation batch adds: (sums, per_sample).

    sums: the loss and the correct answers, added over every batch of every rank. per_sample: each
    text's class probabilities and its label, gathered in dataset order: the AUC needs them all.
    """
    logits = logits_of(model, batch).float()
    labels = batch["labels"]
    loss = F.cross_entropy(logits, labels, reduction="sum")
    sums = {"loss": loss, "correct": (logits.argmax(1) == labels).sum()}
    return sums, {"probabilities": logits.softmax(1), "labels": labels}


def metrics(sums: dict, per_sample: dict, count: int) -> dict:
    """The validation metrics from the whole set's sums and per-sample arrays (numpy); `count` samples.
    Must hold "loss" and BEST_METRIC; each becomes val_<name> in metrics.jsonl."""
    auc = roc_auc(per_sample["probabilities"], per_sample["labels"])
    return {"loss": sums["loss"] / count, "acc": sums["correct"] / count, "auc": auc}


def roc_auc(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC: for two classes the second's, for more the mean of each class's against the rest. nan where a
    class has no validation sample (or only those): its AUC is undefined, and a mean without it would mislead."""
    if probabilities.shape[1] == 2:
        return binary_auc(probabilities[:, 1], labels == 1)
    return float(np.mean([binary_auc(probabilities[:, c], labels == c) for c in range(probabilities.shape[1])]))


def binary_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The chance that a positive scores above a negative, a tie counting half: Mann-Whitney's U over P x N."""
    positives = int(positive.sum())
    negatives = len(positive) - positives
    if not positives or not negatives:
        return float("nan")
    # 1-based ranks, tied scores sharing the mean of the ranks they span.
    _, group, sizes = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(sizes) - (sizes - 1) / 2)[group.ravel()]
    return float((ranks[positive].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def predict_step(model, batch) -> list:
    """One row per text of the batch (predict.py's, the notebook's): the class index and its probability."""
    return rows_from_outputs(predict_outputs(model, batch))


def predict_outputs(model, batch) -> np.ndarray:
    """What predict.py averages over several checkpoints (numpy, a row per text): each text's class
    probabilities."""
    return logits_of(model, batch).float().softmax(1).cpu().numpy()


def rows_from_outputs(outputs: np.ndarray) -> list:
    """predict_step()'s rows from class probabilities (one model's, or several averaged): the class index and its
    probability."""
    return [(int(row.argmax()), float(row.max())) for row in outputs]


def write_predictions(output: str | None, keys: list, rows: list, description: dict, options) -> str:
    """predict.py's file from every text's row, in the order of `keys` (the input's ids), and its path: a CSV
    `id,label` in the input's order (--probabilities: and the label's probability)."""
    output = output or "predictions.csv"
    classes = description.get("classes")
    labels = [classes[label] if classes else str(label) for label, _ in rows]
    chances = [chance for _, chance in rows] if getattr(options, "probabilities", False) else None
    write_csv(output, ["id", "label"], keys, labels, chances, getattr(options, "sample_submission", None))
    return output
