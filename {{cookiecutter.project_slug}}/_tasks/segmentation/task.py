"""The task: image segmentation, a class for every pixel. With model.py and data.py, the whole of what this
project learns.

Edit these functions (and the two constants) for a task of your own; the loops, checkpoints,
predict.py and the notebook call nothing else. Every batch arrives as the loader made it
(here a pair: images [B, C, S, S], masks [B, S, S] of class indices), already on the model's
device, in the run's precision.
"""

import numpy as np
{# torch or paddle: both spell what this file calls alike #}import {{ cookiecutter.framework | replace("pytorch", "torch") }}.nn.functional as F
from PIL import Image

from .data import IGNORE_INDEX
from .errors import UserError
from .submission import image_ids, write_mask_files, write_masks

BEST_METRIC = "miou"  # the metric of metrics() that picks checkpoints/best.*
BEST_MODE = "max"  # "max": higher is better; "min": lower is better
IGNORED = -100 if IGNORE_INDEX is None else IGNORE_INDEX  # the mask value cross_entropy leaves out (-100: none)


def training_loss(model, batch):
    """The batch's mean loss, a scalar: the cross-entropy of every pixel but the ignored ones, averaged."""
    images, masks = batch
    return F.cross_entropy(pixel_rows(model(images)), masks.flatten(), ignore_index=IGNORED)


def validation_step(model, batch) -> tuple[dict, dict]:
    """What one validation batch adds, as sums (over every batch of every rank): each image's mean pixel loss,
    and the confusion matrix of the pixels (row: the true class, column: the predicted one); ignored pixels in
    neither."""
    images, masks = batch
    logits = model(images).float()
    num_classes, labels = logits.shape[1], masks.flatten()
    kept = labels != IGNORED
    losses = F.cross_entropy(pixel_rows(logits), labels, reduction="none", ignore_index=IGNORED)  # 0 where ignored
    counts = kept.reshape(len(masks), -1).sum(1).float().clip(min=1)  # (an image of ignored pixels only: loss 0)
    losses = losses.reshape(len(masks), -1).sum(1) / counts
    pairs = (labels * num_classes + logits.argmax(1).flatten())[kept]
    confusion = pairs.bincount(minlength=num_classes * num_classes).reshape(num_classes, num_classes)
    return {"loss": losses.sum(), "confusion": confusion}, {}


def pixel_rows(logits):
    """[B, classes, S, S] scores as a row of class scores per pixel, [B * S * S, classes]: what cross_entropy
    reads alike in every framework (a 4-D input's class axis is 1 in PyTorch's, the last in Paddle's)."""
    return logits.moveaxis(1, -1).reshape(-1, logits.shape[1])


def metrics(sums: dict, per_sample: dict, count: int) -> dict:
    """The validation metrics from the whole set's sums (numpy); `count` images. "miou": the mean over the
    classes present in the truth or the prediction of intersection / union; "pixel_acc": pixels right."""
    confusion = sums["confusion"]
    hits = np.diag(confusion)
    unions = confusion.sum(axis=0) + confusion.sum(axis=1) - hits
    present = unions > 0
    return {
        "loss": sums["loss"] / count,
        "miou": float(np.mean(hits[present] / unions[present])),
        "pixel_acc": float(hits.sum() / confusion.sum()),
    }


def predict_step(model, batch) -> list:
    """One row per image of the batch: its mask as predicted, the class index of each pixel (uint8 [S, S])."""
    return rows_from_outputs(predict_outputs(model, batch))


def predict_outputs(model, batch) -> np.ndarray:
    """What predict.py averages over several checkpoints and test-time views (numpy): each pixel's class
    probabilities, [images, classes, S, S]."""
    return model(batch).float().softmax(1).cpu().numpy()


def rows_from_outputs(outputs: np.ndarray) -> list:
    """predict_step()'s masks from class probabilities (one model's, or several averaged)."""
    return list(outputs.argmax(axis=1).astype(np.uint8))


def test_time_views(model, batch) -> list[np.ndarray]:
    """predict.py --tta: predict_outputs() of each view of the batch, in the images' own frame: the images as they
    are, and flipped left to right (their masks flipped back)."""
    return [predict_outputs(model, batch), np.flip(predict_outputs(model, batch.flip(-1)), axis=-1)]


def write_predictions(output: str | None, keys: list, rows: list, description: dict, options) -> str:
    """predict.py's masks, each at its image's own size, and their path: with an --output ending in .csv (the default
    with --sample-submission), run-length encoded, a row per image and class found (submission.write_masks(), in
    --rle-order); else 8-bit PNGs, each pixel its class index, in the new or empty folder `output` (default
    predictions/), each under its image's relative path with the suffix .png (submission.write_mask_files())."""
    sample, order = getattr(options, "sample_submission", None), getattr(options, "rle_order", None)
    output = output or ("predictions.csv" if sample else "predictions")

    def mask_of(index: int) -> np.ndarray:
        # Nearest neighbour, as the training masks were read: an index is never blended with its neighbours'.
        image = Image.fromarray(np.asarray(rows[index], dtype=np.uint8)).resize(keys[index][1], Image.NEAREST)
        return np.asarray(image)

    names = [name for name, _ in keys]
    if output.lower().endswith(".csv"):
        classes = description.get("classes") or [str(label) for label in range(description["num_classes"])]
        ids = [image_ids(name) for name in names]
        write_masks(output, names, mask_of, classes, order or "column", sample, ids)
        return output
    if sample or order:
        raise UserError(f"--{'sample-submission' if sample else 'rle-order'} is for a CSV: name --output FILE.csv")
    return write_mask_files(output, names, mask_of)
