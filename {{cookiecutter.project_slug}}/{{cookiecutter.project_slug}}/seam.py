"""The seam between the loops and the three files a user owns: model.py, data.py and task.py.

The loops, the checkpoints and predict.py reach the task only through here: a mistake in it
ends in one line naming the function, and the numbers it returns are combined the same way
whatever the number of processes (validation batches are dealt whole to the ranks, summed in
float64 in batch order, per-sample values put back in dataset order).
"""

import contextlib
import inspect
import math
from collections.abc import Mapping

import numpy as np

from .errors import UserError

MODES = ("max", "min")
# What a task function raises when the batch is not what it expects: told as one line, not a traceback.
MISREAD = (TypeError, ValueError, KeyError, IndexError, AttributeError)


def check_task(task) -> None:
    """task.py's stated best metric and its direction, before anything trains."""
    name, mode = getattr(task, "BEST_METRIC", None), getattr(task, "BEST_MODE", None)
    if not isinstance(name, str) or not name:
        raise UserError(f"task.py: BEST_METRIC is {name!r}: set it to the name of a metric that metrics() returns")
    if mode not in MODES:
        raise UserError(f"task.py: BEST_MODE is {mode!r}: set it to 'max' (higher is better) or 'min'")


@contextlib.contextmanager
def calling(function: str, batch):
    """Run a task function on `batch`: an error from reading it becomes one line naming the function."""
    try:
        yield
    except MISREAD as error:
        raise UserError(
            f"task.{function}() failed on a batch of {structure(batch)} ({type(error).__name__}: {error}): "
            "make it read the batches that data.py's datasets give"
        ) from None


def checked_loss(loss, batch):
    """training_loss()'s value, which must be one number (a tensor of one element) to step on."""
    if not hasattr(loss, "shape") or math.prod(loss.shape) != 1:
        raise UserError(
            f"task.training_loss() returned {structure(loss)} for a batch of {structure(batch)}: it must return "
            "the batch's loss as a scalar tensor (a mean, e.g. loss(...).mean())"
        )
    return loss


def structure(value) -> str:
    """A batch's shape in words, for error lines: tuple(Tensor[32, 3, 16, 16], Tensor[32])."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key!r}: {structure(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}(" + ", ".join(structure(item) for item in value) + ")"
    if hasattr(value, "shape"):
        return f"{type(value).__name__}{list(value.shape)}"
    return type(value).__name__


def sample_count(batch) -> int:
    """The samples in a batch: the first dimension of its first array, however it is nested."""
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        for item in batch:
            with contextlib.suppress(ValueError):
                return sample_count(item)
        raise ValueError("no array in the batch")
    if hasattr(batch, "shape") and len(batch.shape):
        return int(batch.shape[0])
    raise ValueError("no array in the batch")


def metrics_of(task, contributions: list, count: int) -> dict:
    """task.metrics() of the validation set, from every rank's (batch number, sums, per-sample values).

    Sums are added in float64 in batch order, per-sample values concatenated in batch
    order: the same numbers on every rank, and for 1, 2 or 3 processes.
    """
    contributions = sorted(contributions, key=lambda contribution: contribution[0])
    sums: dict = {}
    per_sample: dict = {}
    for _, batch_sums, batch_values in contributions:
        for name, value in batch_sums.items():
            sums[name] = sums[name] + value if name in sums else value
        for name, value in batch_values.items():
            per_sample.setdefault(name, []).append(value)
    per_sample = {name: np.concatenate(values) for name, values in per_sample.items()}
    with calling("metrics", {"sums": sums, "per_sample": per_sample}):
        results = task.metrics(sums, per_sample, count)
    return checked_metrics(task, results)


def checked_metrics(task, results) -> dict:
    """metrics()'s numbers as floats; its names must include the loss and task.BEST_METRIC."""
    if not isinstance(results, Mapping):
        raise UserError(f"task.metrics() returned {structure(results)}: it must return a dict of name: number")
    missing = [name for name in ("loss", task.BEST_METRIC) if name not in results]
    if missing:
        raise UserError(
            f"task.metrics() returned {sorted(results)}, without {' and '.join(map(repr, missing))}: "
            "it must return 'loss' and task.BEST_METRIC"
        )
    numbers = {}
    for name, value in results.items():
        try:
            numbers[name] = float(value)
        except (TypeError, ValueError):
            raise UserError(f"task.metrics()[{name!r}] is {structure(value)}, not a number") from None
    return numbers


def as_float64(values: Mapping, to_numpy) -> dict:
    """validation_step()'s sums as float64 arrays (a count, a loss sum, a confusion matrix)."""
    return {name: np.asarray(to_numpy(value), dtype=np.float64) for name, value in values.items()}


def as_arrays(values: Mapping, to_numpy, count: int) -> dict:
    """validation_step()'s per-sample values as numpy arrays of `count` rows."""
    arrays = {name: np.asarray(to_numpy(value)) for name, value in values.items()}
    for name, array in arrays.items():
        if array.ndim == 0 or len(array) != count:
            raise UserError(
                f"task.validation_step()'s per-sample {name!r} has shape {list(array.shape)} for a batch of {count} "
                "samples: its first dimension must be the batch's samples"
            )
    return arrays


def validation_parts(result, batch) -> tuple[Mapping, Mapping]:
    """validation_step()'s (sums, per_sample) pair, checked."""
    if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(part, Mapping) for part in result)):
        raise UserError(
            f"task.validation_step() returned {structure(result)} for a batch of {structure(batch)}: it must "
            "return (sums, per_sample), two dicts (either may be empty)"
        )
    return result


def data_description(train_set, num_classes: int, model_options: dict | None = None) -> dict:
    """What a checkpoint keeps for predicting, as plain values: the training set's `description`
    (class names, a table's columns and statistics, a vocabulary, ...), with class names
    "0", "1", ... where it names none, and `num_classes` (the network's outputs). A dataset that sets the older attributes (classes,
    image_size, channels, mean, std) instead is described by those. `model_options` (--model-option's, from
    chosen_options()) are kept too: predict.py builds the network they made."""
    description = dict(getattr(train_set, "description", None) or {})
    if not description:
        older = ("classes", "image_size", "channels", "mean", "std")
        description = {name: getattr(train_set, name) for name in older if getattr(train_set, name, None) is not None}
    if not description.get("classes"):
        description["classes"] = [str(label) for label in range(num_classes)]
    description["classes"] = [str(name) for name in description["classes"]]
    if model_options:
        description["model_options"] = model_options
    return {**description, "num_classes": num_classes}


def chosen_options(build_model, chosen: list[tuple[str, object]], shown: bool = True) -> dict:
    """--model-option's (name, value) pairs as keyword arguments, each a parameter that build_model() takes
    (num_classes comes from the data); a name it does not take ends the job in one line naming those it does
    (`shown`: on this rank)."""
    parameters = inspect.signature(build_model).parameters.values()
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = [parameter.name for parameter in parameters if parameter.kind in keywords]
    accepted = [name for name in named if name != "num_classes"]
    takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)  # **options
    for name, _ in chosen:
        if name == "num_classes" or (name not in accepted and not takes_any):
            raise UserError(
                f"--model-option {name}: build_model() in model.py takes no such parameter; it takes "
                f"{', '.join(accepted) or 'none but num_classes'}",
                shown=shown,
            )
    return dict(chosen)


def model_options(build_model, description: dict) -> dict:
    """The keyword arguments of build_model(): those the data description fills (channels, a vocabulary's size, the
    number of features, ...), and over them the --model-option values it records. build_model(num_classes) stays
    the extension point, and gets what it asks for by name."""
    accepted = [name for name in inspect.signature(build_model).parameters if name != "num_classes"]
    filled = {name: description[name] for name in accepted if description.get(name) is not None}
    return filled | description.get("model_options", {})
