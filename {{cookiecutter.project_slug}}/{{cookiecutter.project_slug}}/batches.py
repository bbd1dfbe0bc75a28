"""Batches: which samples go where, the same on every rank (whole batches dealt to the ranks, for validation and
prediction: the same batches whatever the number of processes, so each sample's numbers are too, and every sample
counted once; a stopped epoch's rest; the samples held out for validation; all the labeled ones, for --folds); and
what a loader gives the loops: a batch's samples counted whatever its structure, its structure in words for error lines, and the user's dataset and
collate guarded, so that their errors (in a loader worker too) reach the loop as a batch that says them, naming the
user's function (a guarded loader's batches go through sample_count() first).
"""

import collections
import contextlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .errors import UserError, first_line, from_user_code


class DealtBatches:
    """The batches [0, B), [B, 2B), ... of a dataset of `dataset_size`; rank r takes batches r, r + world, ...

    A batch sampler of either framework's DataLoader. Ranks may get different numbers of
    batches (none, for a set smaller than the world's batches): no collective per batch.
    """

    shuffle = drop_last = False  # read by paddle's DataLoader, as of its own batch samplers

    def __init__(self, dataset_size: int, batch_size: int, rank: int = 0, world_size: int = 1):
        self.dataset_size, self.batch_size = dataset_size, batch_size
        batches = -(-dataset_size // batch_size)
        self.numbers = list(range(rank, batches, world_size))
        self.most_batches = -(-batches // world_size)  # those of the ranks with most

    def size_of(self, number: int) -> int:
        """The samples in batch `number`: all but the very last batch are full."""
        return min(self.batch_size, self.dataset_size - number * self.batch_size)

    def indices(self, number: int) -> range:
        return range(number * self.batch_size, number * self.batch_size + self.size_of(number))

    def __iter__(self):
        return (list(self.indices(number)) for number in self.numbers)

    def __len__(self) -> int:
        return len(self.numbers)


def rest_of_epoch(order: list[int], consumed: int, rank: int, world_size: int) -> list[int]:
    """Rank `rank`'s samples of an epoch whose global `order` (the same on every rank and for any number of
    processes) goes on after its first `consumed` samples: the rest, padded with the order's first samples so
    that every rank takes as many steps, taken every `world_size`-th from `rank` on (as DistributedSampler does).

    After k batches of B samples on each of W ranks, the ranks together have trained the first consumed + k·B·W
    samples of the order: a stopped epoch goes on from that count on any number of processes, no sample twice
    and none left out.
    """
    consumed = min(consumed, len(order))  # (a set that shrank since the stop: its epoch ends)
    rest = order[consumed:]
    rest += [order[i % len(order)] for i in range(padding_of(len(order), consumed, world_size))]
    return rest[rank::world_size]


def padding_of(size: int, consumed: int, world_size: int) -> int:
    """The repeated samples rest_of_epoch() adds: not distinct, so not counted among an epoch's samples."""
    return -(size - min(consumed, size)) % world_size


def share_size(size: int, consumed: int, world_size: int) -> int:
    """The length of each rank's rest_of_epoch()."""
    return (size - min(consumed, size) + padding_of(size, consumed, world_size)) // world_size


class RestOfEpoch:
    """What the loaders' ResumableSampler (a framework's distributed sampler) counts of an epoch that goes on after
    its first `consumed` samples, dealt to `ranks` processes in batches of `batch_size` from its `dataset`."""

    consumed = 0

    def share(self, order: list[int], rank: int) -> list[int]:
        return rest_of_epoch(order, self.consumed, rank, self.ranks)

    def share_length(self) -> int:
        return share_size(len(self.dataset), self.consumed, self.ranks)

    @property
    def padding(self) -> int:
        return padding_of(len(self.dataset), self.consumed, self.ranks)

    def consumed_after(self, batches: int) -> int:
        """The samples of the epoch's order trained once every rank has trained `batches` more (whole) batches."""
        return self.consumed + batches * self.batch_size * self.ranks


def val_count(count: int, fraction: float) -> int:
    """Samples of a label held out: fraction x count rounded, at least one (if two or more), at most count - 1."""
    return 0 if count < 2 else min(count - 1, max(1, int(fraction * count + 0.5)))


def split_by_label(labels: list[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(kept, held out): sorted indices, `fraction` of each label's samples held out for validation (rounded; at
    least one of a label of two or more, never all of one). Each label draws from a generator of its own, (seed,
    label), never the global one: the same split on every rank and every run for a seed, and samples added to one
    label change nothing of another's."""
    labels_array = np.asarray(labels)
    held: set[int] = set()
    for label in sorted(set(labels)):
        members = np.flatnonzero(labels_array == label)
        rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, int(label)])
        held.update(rng.permutation(members)[: val_count(len(members), fraction)].tolist())
    return [index for index in range(len(labels)) if index not in held], sorted(held)


class Labeled(NamedTuple):
    """--folds: what data.py's build_labeled_set(args) returns: every labeled sample as one dataset, the network's
    outputs, and each sample's id (unique), stratum and group (None: folds are stratified, not grouped); its key for
    task.write_predictions() where that is not its id (segmentation: the image's id and size); and, where a fold's
    sets are described from its own training samples (a vocabulary, statistics), `parts(train, val)`, which makes
    them from the samples' positions (`dataset` may then be None)."""

    dataset: object
    outputs: int
    ids: list[str]
    strata: list
    groups: list | None = None
    keys: list | None = None
    parts: object = None


def quantile_bins(values, folds: int) -> list[int]:
    """Strata of a numeric target: its quantile bins, 10, fewer where the data is small (each at least `folds`)."""
    values = np.asarray(values, dtype=np.float64)
    bins = max(1, min(10, len(values) // folds))
    edges = np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1])
    return np.searchsorted(edges, values, side="right").tolist()


def with_leaves(batch, convert):
    """A batch of any structure (a tuple, a list, a named tuple, a dict, nested) with convert() of each of the other
    values in it (its tensors and arrays)."""
    if isinstance(batch, Mapping):
        return {key: with_leaves(value, convert) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(with_leaves(value, convert) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(with_leaves(value, convert) for value in batch)
    return convert(batch)


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
