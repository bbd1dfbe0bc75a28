"""The seam between the loops and the three files a user owns: model.py, data.py and task.py.

The loops, the checkpoints and predict.py reach the task only through here: a mistake in it
ends in one line naming the function (the user's frames above it where their code raised), and
the numbers it returns are combined the same way whatever the number of processes (validation
batches are dealt whole to the ranks, summed in float64 in batch order, per-sample values put
back in dataset order, padded with -100 where batches differ in shape).
"""

import collections
import contextlib
import inspect
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .errors import UserError, first_line, from_user_code, user_frames

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


def checked_loss(loss, batch):
    """training_loss()'s value, which must be one number (a tensor of one element) to step on."""
    if not hasattr(loss, "shape") or math.prod(loss.shape) != 1:
        raise UserError(
            f"task.training_loss() returned {structure(loss)} for a batch of {structure(batch)}: it must return "
            "the batch's loss as a scalar tensor (a mean, e.g. loss(...).mean())"
        )
    return loss


def structure(value) -> str:
    """A batch's shape in words, for error lines: tuple(Tensor[32, 3, 16, 16], Tensor[32]); a long list by its first
    items and its length."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key!r}: {structure(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        shown = [structure(item) for item in value[:3]] + ([f"... {len(value)} items"] if len(value) > 3 else [])
        return f"{type(value).__name__}(" + ", ".join(shown) + ")"
    if hasattr(value, "shape"):
        return f"{type(value).__name__}{list(value.shape)}"
    return type(value).__name__


def sample_count(batch) -> int:
    """The samples in a batch from a loader, whatever its structure: a tensor; a tuple, list or dict of tensors and
    per-sample lists (of dicts, of tensors of their own shapes, of numbers or strings), nested, in any order; a list
    of per-sample dicts. A batch that stands for an error of the data's code (GuardedCollate) raises it."""
    if isinstance(batch, Mapping) and FAILED in batch:
        raise UserError(str(batch[FAILED]), frames=str(batch[FRAMES]))
    try:
        counts = _counts(batch, whole=True)
    except TypeError as unreadable:
        counts, problem = [], f"the loops cannot read a {unreadable}"
    else:
        problem = "it holds no array" if counts is None else "its parts disagree on its number of samples"
    if not counts:
        raise UserError(f"a batch of {structure(batch)}: {problem}; {BATCH_FORMS}")
    return counts[0]


BATCH_FORMS = (
    "a batch must be a tensor or an array, or a tuple, list or dict of them (and of per-sample lists), each with the "
    "batch's samples along its first dimension"
)


def _counts(value, whole: bool = False) -> list[int] | None:
    """The sample counts `value` can stand for, most likely first; None: it says nothing of them (a number, a
    string, an empty list). A list of tensors or dicts is read as the batch's parts, each of N samples (the default
    collate's list, where it is the batch itself: `whole`), or as N samples of their own shapes (inside a batch)."""
    if hasattr(value, "shape"):
        return [int(value.shape[0])] if len(value.shape) else None
    if isinstance(value, Mapping):
        return _agreed([_counts(item) for item in value.values()])
    if isinstance(value, (set, frozenset)):
        raise TypeError(type(value).__name__)
    if not isinstance(value, (tuple, list)) or not value:
        return None
    if not any(_is_part(item) for item in value) or _per_sample_dicts(value):
        return [len(value)]  # numbers, strings, paths, images; or a sample's dict each
    parts = _agreed([_counts(item) for item in value])
    if whole:
        return parts or ([len(value)] if all(isinstance(item, Mapping) for item in value) else parts)
    return list(dict.fromkeys([len(value), *(parts or [])]))


def _is_part(value) -> bool:
    return hasattr(value, "shape") or isinstance(value, (Mapping, tuple, list))


def _per_sample_dicts(items: list | tuple) -> bool:
    """Dicts of the same keys (a sample's targets each), or holding a number or string of their own (a label): not a
    batch's parts (inputs and targets), each of the batch's samples."""
    dicts = [item for item in items if isinstance(item, Mapping)]
    plain = any(isinstance(value, (str, int, float)) for item in dicts for value in item.values())
    return bool(dicts) and (plain or len(dicts) == len(items) and len({frozenset(item) for item in dicts}) == 1)


def _agreed(options: list[list[int] | None]) -> list[int] | None:
    """The counts every part can stand for (in the first informative part's order), else the one most of three or
    more parts stand for (a batch-wide tensor among them: position ids, class weights); [] where they disagree;
    None where no part says."""
    known = [counts for counts in options if counts is not None]
    if not known:
        return None
    every = [count for count in known[0] if all(count in counts for counts in known[1:])]
    if every or len(known) < 3:
        return every
    support = collections.Counter(count for counts in known for count in set(counts))
    (count, most), *rest = support.most_common()
    return [count] if 2 * most > len(known) and not (rest and rest[0][1] == most) else []


# A batch that stands for an error raised while the loader made it (in a worker process, or in paddle's loader
# thread, where an exception would not reach the loop as itself): its message and the user's frames, and an array
# so that every loader passes it on.
FAILED, FRAMES = "<error of the data's code>", "<frames>"


class _Failed:
    """What GuardedDataset gives for a sample whose reading raised: the error, to be said by the batch."""

    def __init__(self, error: UserError):
        self.error = error


def _failed_batch(error: UserError) -> dict:
    return {FAILED: str(error), FRAMES: error.frames, "_": np.zeros(1, dtype=np.uint8)}


class GuardedDataset:
    """A dataset whose samples' errors reach the loop as a failed batch (GuardedCollate), with the user's frames
    and the name of the function that raised; its other attributes are the dataset's own."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        try:
            return self.dataset[index]
        except Exception as error:
            return _Failed(_explained(error, type(self.dataset).__getitem__))

    def __getitems__(self, indices: list) -> list:
        """torch's loader reads a batch's samples at once where the dataset can (a Subset, a Hugging Face dataset)."""
        reader = getattr(self.dataset, "__getitems__", None)
        if reader is None:
            return [self[index] for index in indices]
        try:
            return reader(indices)
        except Exception as error:
            return [_Failed(_explained(error, reader))]

    def __getattr__(self, name: str):
        # The dataset's own attributes (its collate, its description); not `dataset` while a copy is being made (no
        # endless lookups), nor Python's and the loaders' special names, which would go around the guard.
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _explained(error: Exception, function) -> UserError:
    """An error of the data's code as one line: the user's frames and function (errors.from_user_code()), else
    `function`, which raised it."""
    explained = error if isinstance(error, UserError) else from_user_code(error)
    return explained or UserError(f"{_named(function)} raised {first_line(error)}")


class GuardedCollate:
    """The loader's collate: the dataset's own collate() (else `default`, the framework's), whose error, or batch
    the loops cannot read, becomes a failed batch naming it; a failed sample's batch is its error. (A class, so
    that loader workers started by spawn can pickle it.)"""

    def __init__(self, dataset, default):
        self.dataset, self.collate = dataset, getattr(dataset, "collate", None) or default
        self.own = self.collate is not default

    def __call__(self, samples):
        failed = next((sample for sample in samples if isinstance(sample, _Failed)), None)
        if failed is not None:
            return _failed_batch(failed.error)
        try:
            batch = self.collate(samples)
        except Exception as error:
            if self.own or isinstance(error, UserError) or from_user_code(error):
                return _failed_batch(_explained(error, self.collate))
            return _failed_batch(self._unbatchable(error))
        try:
            sample_count(batch)
        except UserError as error:
            return _failed_batch(UserError(f"{_named(self.collate)} made {error}"))
        return batch

    def _unbatchable(self, error: BaseException) -> UserError:
        """The framework's collate could not make a batch of the dataset's samples."""
        return UserError(
            f"the samples of {type(self.dataset).__name__} cannot be made into a batch ({first_line(error)}): give "
            "them the same shapes, or give the dataset a collate(samples) that pads them"
        )


def _named(function) -> str:
    """A function as error lines name it: "TextDataset.collate() in data.py" (a functools.partial by its function,
    a callable object by its class)."""
    function = getattr(function, "func", function)
    name = getattr(function, "__qualname__", type(function).__qualname__)
    with contextlib.suppress(TypeError, OSError):
        return f"{name}() in {Path(inspect.getsourcefile(function)).name}"
    return f"{name}()"


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
    per_sample = {name: padded(name, values) for name, values in per_sample.items()}
    with calling("metrics", {"sums": sums, "per_sample": per_sample}):
        results = task.metrics(sums, per_sample, count)
    return checked_metrics(task, results)


PAD = -100  # HF's: a task that pads its own batches with it reads the gathered values the same way


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
