"""The seam between the loops and the three files a user owns: model.py, data.py and task.py.

Task is the one way in: built once from the three files and checked, it is handed to the loops, the
checkpoints, predict.py, the notebook and FSDP's wrapping, and nothing else imports the files. A mistake
in them ends in one line naming the function (the user's frames above it where their code raised), and
the numbers task.py returns are combined the same way whatever the number of processes (validation
batches are dealt whole to the ranks, summed in float64 in batch order, per-sample values put back in
dataset order, padded with -100 where batches differ in shape).
"""

import contextlib
import importlib
import inspect
import json
import math
import os
from collections.abc import Mapping
from functools import partial

import numpy as np

from .batches import structure
from .errors import UserError, from_user_code, user_frames

MODES = ("max", "min")
# What a task function raises when the batch is not what it expects: told as one line, not a traceback.
MISREAD = (TypeError, ValueError, KeyError, IndexError, AttributeError)
PAD = -100  # HF's: a task that pads its own batches with it reads the gathered values the same way


# The kinds of a --model-option value that a build_model() parameter's number or bool default takes.
_KINDS = {bool: ((bool,), "True or False"), int: ((int,), "a whole number"), float: ((int, float), "a number")}


# The three files' modification times when they were last imported.
_IMPORTED: dict[str, int] = {}


def as_on_disk(*modules) -> tuple:
    """`modules`, imported again, in that order, where any of their files changed since they were: a notebook's
    kernel keeps a module as it first imported it, and the notebook asks for changes to the three files."""
    stamps = {module.__name__: os.stat(module.__file__).st_mtime_ns for module in modules}
    if any(_IMPORTED.get(name, stamp) != stamp for name, stamp in stamps.items()):
        modules = tuple(importlib.reload(module) for module in modules)
    _IMPORTED.update(stamps)  # (not where a reload failed: the next Task() tries again)
    return modules


class Task:
    """What this project learns, from its three files (model.py, data.py, task.py: the modules given, for tests);
    task.py's best metric and its direction checked at once."""

    def __init__(self, model=None, data=None, task=None):
        # Imported here, not with this module: a mistake at their top level is then the run's one error line too.
        from . import data as data_file
        from . import model as model_file
        from . import task as task_file

        data_file, model_file, task_file = as_on_disk(data_file, model_file, task_file)
        model, data, task = model or model_file, data or data_file, task or task_file
        self.model, self.data, self.task = model, data, task
        self.best_metric, self.best_mode = getattr(task, "BEST_METRIC", None), getattr(task, "BEST_MODE", None)
        if not isinstance(self.best_metric, str) or not self.best_metric:
            raise UserError(
                f"task.py: BEST_METRIC is {self.best_metric!r}: set it to the name of a metric that metrics() returns"
            )
        if self.best_mode not in MODES:
            raise UserError(f"task.py: BEST_MODE is {self.best_mode!r}: set it to 'max' (higher is better) or 'min'")
        self.units = tuple(getattr(model, "FSDP_UNITS", ()))  # FSDP's units: model.py's block classes
        self.predict_sample = getattr(data, "PREDICT_SAMPLE", None)  # what of the sample the notebook predicts

    # data.py

    def datasets(self, args) -> tuple:
        """data.build_datasets(args): (train_set, val_set, outputs), the network's outputs (its num_classes)."""
        return self.data.build_datasets(args)

    def labeled_set(self, args):
        """data.build_labeled_set(args) (--folds): every labeled sample, with its id and stratum (folds.Labeled)."""
        build = getattr(self.data, "build_labeled_set", None)
        if build is None:
            raise UserError(
                "--folds: data.py has no build_labeled_set(args), which says every labeled sample's id and stratum: "
                "add it (README: A competition, from folds to a submission)"
            )
        return build(args)

    def predict_set(self, source, description: dict) -> tuple:
        """data.build_predict_set(): predict.py's inputs and their keys."""
        return self.data.build_predict_set(source, description)

    # model.py

    def chosen_options(self, chosen: list[tuple[str, object]], shown: bool = True) -> dict:
        """--model-option's (name, value) pairs as keyword arguments, each a parameter that build_model() takes
        (num_classes comes from the data); a name it does not take, or a value of another kind than the parameter's
        number or bool default, ends the job in one line (`shown`: on this rank)."""
        parameters = inspect.signature(self.model.build_model).parameters
        keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        accepted = [parameter.name for parameter in parameters.values() if parameter.kind in keywords][1:]
        takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())
        for name, value in chosen:
            if name == "num_classes" or (name not in accepted and not takes_any):
                raise UserError(
                    f"--model-option {name}: build_model() in model.py takes no such parameter; it takes "
                    f"{', '.join(accepted) or 'none but num_classes'}",
                    shown=shown,
                )
            default = parameters[name].default if name in parameters else None
            kinds, words = _KINDS.get(type(default), ((), ""))
            if kinds and type(value) not in kinds:  # (a bool is no int here: width=True is a mistake)
                raise UserError(
                    f"--model-option {name}={value}: build_model() in model.py takes {name} as {words} (its default "
                    f"is {default})",
                    shown=shown,
                )
        return dict(chosen)

    def network(self, description: dict, outputs: int | None = None, weights: dict | None = None):
        """model.build_model(): the network of `outputs`, by default the description's (its num_classes) or, for bare
        `weights`, the size of the last tensor saved (the last layer's bias in most networks); with model_options()."""
        outputs = outputs or description.get("num_classes") or int(list(weights.values())[-1].shape[0])
        return self.model.build_model(outputs, **self.model_options(description))

    def model_options(self, description: dict) -> dict:
        """The keyword arguments of build_model(): those it names that the data description fills (channels, a
        vocabulary's size, the number of features, ...), and over them the --model-option values it records."""
        accepted = list(inspect.signature(self.model.build_model).parameters)[1:]
        filled = {name: description[name] for name in accepted if description.get(name) is not None}
        return filled | description.get("model_options", {})

    def optimizer(self, network, lr: float):
        return self.model.build_optimizer(network, lr)

    # task.py

    def training_loss(self, model, batch):
        """task.training_loss(), which must be one number (a tensor of one element) to step on."""
        with calling("training_loss", batch):
            loss = self.task.training_loss(model, batch)
        if not hasattr(loss, "shape") or math.prod(loss.shape) != 1:
            raise UserError(
                f"task.training_loss() returned {structure(loss)} for a batch of {structure(batch)}: it must return "
                "the batch's loss as a scalar tensor (a mean, e.g. loss(...).mean())"
            )
        return loss

    def validation_step(self, model, batch, samples: int, to_numpy) -> tuple[dict, dict]:
        """task.validation_step()'s (sums, per_sample) as numpy: sums in float64 (a count, a loss sum, a confusion
        matrix), per-sample arrays of `samples` rows."""
        with calling("validation_step", batch):
            result = self.task.validation_step(model, batch)
        if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(part, Mapping) for part in result)):
            raise UserError(
                f"task.validation_step() returned {structure(result)} for a batch of {structure(batch)}: it must "
                "return (sums, per_sample), two dicts (either may be empty)"
            )
        sums = {name: np.asarray(to_numpy(value), dtype=np.float64) for name, value in result[0].items()}
        per_sample = {name: np.asarray(to_numpy(value)) for name, value in result[1].items()}
        for name, array in per_sample.items():
            if array.ndim == 0 or len(array) != samples:
                raise UserError(
                    f"task.validation_step()'s per-sample {name!r} has shape {list(array.shape)} for a batch of "
                    f"{samples} samples: its first dimension must be the batch's samples"
                )
        return sums, per_sample

    def metrics(self, contributions: list, count: int) -> dict:
        """task.metrics() of the validation set, from every rank's (batch number, sums, per-sample values).

        Sums are added in float64 in batch order, per-sample values concatenated in batch
        order: the same numbers on every rank, and for 1, 2 or 3 processes.
        """
        return self.metrics_of(*self.combined(contributions), count)

    def combined(self, contributions: list) -> tuple[dict, dict]:
        """(sums, per-sample values) of every rank's (batch number, sums, per-sample values), in batch order."""
        sums: dict = {}
        per_sample: dict = {}
        for _, batch_sums, batch_values in sorted(contributions, key=lambda contribution: contribution[0]):
            for name, value in batch_sums.items():
                sums[name] = sums[name] + value if name in sums else value
            for name, value in batch_values.items():
                per_sample.setdefault(name, []).append(value)
        return sums, {name: padded(name, values) for name, values in per_sample.items()}

    def metrics_of(self, sums: dict, per_sample: dict, count: int) -> dict:
        """task.metrics() of combined sums and per-sample values (of one validation, or of every fold's, pooled)."""
        with calling("metrics", {"sums": sums, "per_sample": per_sample}):
            results = self.task.metrics(sums, per_sample, count)
        return self._checked_metrics(results)

    def _checked_metrics(self, results) -> dict:
        """metrics()'s numbers as floats; its names must include the loss and BEST_METRIC."""
        if not isinstance(results, Mapping):
            raise UserError(f"task.metrics() returned {structure(results)}: it must return a dict of name: number")
        missing = [name for name in ("loss", self.best_metric) if name not in results]
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

    def predict_rows(self, model, batch) -> list:
        """task.predict_step(): one row per input of the batch."""
        with calling("predict_step", batch):
            return list(self.task.predict_step(model, batch))

    def validation_rows(self, model, batch) -> list:
        """predict_step() on a validation batch's inputs (out-of-fold predictions): a batch (inputs, targets) gives
        its first part; any other (a dict of named parts) is given whole."""
        return self.predict_rows(model, batch[0] if isinstance(batch, (tuple, list)) else batch)

    def check_averaging(self, checkpoints: int, tta: bool) -> None:
        """predict.py's ensemble of several checkpoints, or --tta: what task.py must say for it, or one line."""
        if checkpoints > 1 and not all(hasattr(self.task, name) for name in ("predict_outputs", "rows_from_outputs")):
            raise UserError(
                f"--checkpoint names {checkpoints} checkpoints: task.py has no predict_outputs() and rows_from_outputs(), "
                "which say what an ensemble averages and how rows are made from it: add them (README: A competition, "
                "from folds to a submission), or give one checkpoint"
            )
        said = {"test_time_views": "the views of a batch to average", "rows_from_outputs": "rows from their average"}
        lacking = [f"{name}() ({what})" for name, what in said.items() if not hasattr(self.task, name)]
        if tta and lacking:
            raise UserError(
                f"--tta: task.py has no {' and no '.join(lacking)}: add {'them' if len(lacking) > 1 else 'it'} "
                "(README: A competition, from folds to a submission), or leave out --tta"
            )

    def averaged_outputs(self, model, batch, tta: bool) -> np.ndarray:
        """task.predict_outputs() of the batch, or with --tta the mean of its test_time_views()', in float64."""
        with calling("test_time_views" if tta else "predict_outputs", batch):
            views = self.task.test_time_views(model, batch) if tta else [self.task.predict_outputs(model, batch)]
        return sum(np.asarray(view, dtype=np.float64) for view in views) / len(views)

    def rows_from_outputs(self, outputs: np.ndarray) -> list:
        with calling("rows_from_outputs", outputs):
            return list(self.task.rows_from_outputs(outputs))

    def write_predictions(self, output, keys: list, rows: list, description: dict, options) -> str:
        return self.task.write_predictions(output, keys, rows, description, options)


@contextlib.contextmanager
def calling(function: str, batch):
    """Run a task function on `batch`: an error from reading it becomes one line naming the function, under the
    user's frames; one that went wrong deeper in the user's files (model.py's forward()) names that function."""
    try:
        yield
    except MISREAD as error:
        frames, where = user_frames(error)
        if where not in (None, f"{function}() in task.py"):
            raise from_user_code(error) from None
        raise UserError(
            f"task.{function}() failed on a batch of {structure(batch)} ({type(error).__name__}: {error}): "
            "make it read the batches that data.py's datasets give",
            frames=frames,
        ) from None


def padded(name: str, arrays: list[np.ndarray]) -> np.ndarray:
    """Per-sample arrays of the batches in order, as one: where their shapes after the first dimension differ (each
    batch padded to its own longest sentence), each is padded to the largest with PAD (in a type that holds it;
    boolean masks with False)."""
    shapes = {array.shape[1:] for array in arrays if len(array)}
    if len(shapes) <= 1:
        return np.concatenate(arrays)
    if len({len(shape) for shape in shapes}) > 1:
        raise UserError(
            f"task.validation_step()'s per-sample {name!r} has {' and '.join(sorted({str(len(s) + 1) for s in shapes}))} "
            "dimensions in different batches: give it the same number in every batch"
        )
    largest = tuple(max(sizes) for sizes in zip(*shapes, strict=True))
    dtype = np.result_type(*arrays)
    # -100 in a signed type (unsigned values: the next larger one); a mask stays a mask, padded with False.
    pad, dtype = (False, dtype) if dtype == np.bool_ else (PAD, np.promote_types(dtype, np.int8))
    whole = np.full((sum(len(array) for array in arrays), *largest), pad, dtype=dtype)
    start = 0
    for array in arrays:
        whole[(slice(start, start + len(array)), *(slice(0, size) for size in array.shape[1:]))] = array
        start += len(array)
    return whole


def data_description(train_set, outputs: int, model_options: dict | None = None) -> dict:
    """What a checkpoint keeps for predicting, as plain values: the training set's `description` (class names, a
    table's columns and statistics, a vocabulary, ...; the older datasets of this template set attributes instead,
    read as they were), and the network's `outputs` as `num_classes`. `model_options` (--model-option's, from
    Task.chosen_options()) are kept too: predict.py builds the network they made."""
    description = dict(getattr(train_set, "description", None) or {})
    if not description:
        older = ("classes", "image_size", "channels", "mean", "std")
        description = {name: getattr(train_set, name) for name in older if getattr(train_set, name, None) is not None}
    if "classes" in description:
        description["classes"] = [str(name) for name in description["classes"]]
    if model_options:
        description["model_options"] = model_options
    return {**description, "num_classes": outputs}


def changed_description(saved: dict | None, current: dict) -> list[str]:
    """The keys of data_description() whose values differ from those a resumed checkpoint kept (`saved`; None or
    a key it lacks: nothing to compare). Compared as JSON: a tuple read back as a list is the same value."""
    as_json = partial(json.dumps, sort_keys=True, default=str)
    return [key for key, value in current.items() if key in (saved or {}) and as_json(saved[key]) != as_json(value)]
