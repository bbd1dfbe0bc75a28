"""Datasets of texts. Extension point: replace build_datasets() to train on your own data, build_predict_set() to
predict on new inputs.

build_datasets(args) returns (train_set, val_set, num_classes). The data folder (--data-dir) holds train.csv,
and val.csv if you have one (else --val-fraction of each class of train.csv is held out), each with a header
row and the columns `text` and `label` (a class name); other columns are ignored.

Texts become token ids with the standard library only: lower-cased words (tokens()), each looked up in a
vocabulary built from the training texts (build_vocabulary()): 0 is padding, 1 a word it does not know. The
vocabulary and the length texts are cut to travel in the training set's `description`, so every checkpoint
can read new texts the same way. A sample is {"input_ids": int64 array, "labels": class index}; the
datasets' collate() pads a batch's texts to its longest into {"input_ids", "attention_mask", "labels"}, numpy
arrays that the loops make tensors. A dataset is any object with __len__ and __getitem__ (the framework's own
Dataset classes too).
"""

import collections
import csv
import logging
import re
from pathlib import Path

import numpy as np

from .archive import dataset_root, is_junk
from .batches import Labeled, split_by_label
from .errors import UserError

log = logging.getLogger(__name__)

# run.py's options that this file reads, beside run.py's own: plain values (README: "Your own options").
OPTIONS = {
    "--val-fraction": {
        "type": "fraction",
        "default": 0.1,
        "help": "without val.csv: the part of each class of train.csv held out for validation, the same on every "
        "rank and run for a given --seed",
    },
    "--group-column": {
        "metavar": "NAME",
        "help": "with --folds: the CSV column whose equal values form a group (an author, a source), never split "
        "across folds",
    },
}
# predict.py's options that task.py's write_predictions() reads.
PREDICT_OPTIONS = {
    "--sample-submission": {
        "type": "file",
        "metavar": "FILE",
        "help": "a competition's sample CSV: its header, its ID column (the input's id) and its row order are "
        "followed; the second column gets the label, a third the probability (with --probabilities)",
    },
    "--probabilities": {"action": "store_true", "help": "add a column with the predicted class's probability"},
}

MAX_LENGTH = 128  # tokens a text is cut to
MAX_VOCABULARY = 20_000  # ids, padding and unknown included
MIN_COUNT = 2  # a word seen fewer times in the training texts is unknown: it could not be learned
PAD, UNKNOWN = 0, 1
SPECIAL = ["<pad>", "<unk>"]
VAL_FRACTION = 0.1
PREDICT_SAMPLE = "val.csv"  # what of the sample data (under --data-dir) the notebook lets predict.py predict
WORD = re.compile(r"\w+")
SYNTHETIC_CLASSES = 4
SYNTHETIC_TRAIN, SYNTHETIC_VAL = 2048, 512
SYNTHETIC_WORDS = 500


class TextDataset:
    """Texts as token ids, with their class indices (None: texts to predict)."""

    def __init__(self, token_ids: list[np.ndarray], labels: list[int] | None, description: dict):
        self.token_ids, self.labels, self.description = token_ids, labels, description

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, index: int) -> dict:
        if self.labels is None:
            return {"input_ids": self.token_ids[index]}
        return {"input_ids": self.token_ids[index], "labels": self.labels[index]}

    @staticmethod
    def collate(samples: list[dict]) -> dict:
        """A batch: the texts padded to the longest of the batch, a mask of their real tokens, the labels if any."""
        lengths = [len(sample["input_ids"]) for sample in samples]
        input_ids = np.full((len(samples), max(1, *lengths)), PAD, dtype=np.int64)
        for row, sample in enumerate(samples):
            input_ids[row, : lengths[row]] = sample["input_ids"]
        mask = (np.arange(input_ids.shape[1]) < np.asarray(lengths)[:, None]).astype(np.int64)
        batch = {"input_ids": input_ids, "attention_mask": mask}
        if "labels" in samples[0]:
            batch["labels"] = np.asarray([sample["labels"] for sample in samples], dtype=np.int64)
        return batch


def tokens(text: str) -> list[str]:
    """The words of a text, lower-cased: runs of letters, digits and underscores."""
    return WORD.findall(text.lower())


def build_vocabulary(texts: list[str]) -> list[str]:
    """Padding, unknown, then the words seen at least MIN_COUNT times, most frequent first (ties by the word),
    MAX_VOCABULARY in all: a word's id is its index."""
    counts = collections.Counter(word for text in texts for word in tokens(text))
    words = sorted((word for word, count in counts.items() if count >= MIN_COUNT), key=lambda w: (-counts[w], w))
    return SPECIAL + words[: MAX_VOCABULARY - len(SPECIAL)]


def describe(classes: list[str], vocabulary: list[str]) -> dict:
    """What predicting needs, kept by every checkpoint as plain values: the class names, the vocabulary (and its
    size, for build_model()), the length texts are cut to."""
    return {"classes": classes, "vocabulary": vocabulary, "vocab_size": len(vocabulary), "max_length": MAX_LENGTH}


def encode(texts: list[str], description: dict) -> list[np.ndarray]:
    """Each text as int64 token ids by the description's vocabulary, cut to its max_length."""
    ids = {word: index for index, word in enumerate(description["vocabulary"])}
    length = description.get("max_length") or MAX_LENGTH
    return [np.asarray([ids.get(word, UNKNOWN) for word in tokens(text)[:length]], dtype=np.int64) for text in texts]


def build_datasets(args) -> tuple[TextDataset, TextDataset, int]:
    if args.synthetic:
        return synthetic_datasets(args.seed)
    root = dataset_root(args.data_dir, "train.csv")
    if not (root / "train.csv").is_file():
        raise UserError(
            f"{root / 'train.csv'} not found: --data-dir needs train.csv (columns text and label), and val.csv if "
            "you have one, or one folder holding them"
        )
    texts, names = read_labelled(root / "train.csv")
    classes = sorted(set(names.values()))
    index = {name: label for label, name in enumerate(classes)}
    labels = [index[name] for name in names.values()]
    if (root / "val.csv").is_file():
        val_texts, val_names = read_labelled(root / "val.csv")
        val_labels = [class_index(name, index, root / "val.csv", line) for line, name in val_names.items()]
    else:
        fraction = getattr(args, "val_fraction", None) or VAL_FRACTION
        train_rows, val_rows = split_by_label(labels, fraction, args.seed)
        log.info("no val.csv: %d of %d texts held out (--val-fraction %g)", len(val_rows), len(labels), fraction)
        if not val_rows:
            raise UserError(
                f"no validation texts to hold out of {root / 'train.csv'}: a class needs two texts or more for one to "
                "be held out; add texts, or provide val.csv"
            )
        val_texts, val_labels = [texts[i] for i in val_rows], [labels[i] for i in val_rows]
        texts, labels = [texts[i] for i in train_rows], [labels[i] for i in train_rows]
    description = describe(classes, build_vocabulary(texts))
    train = TextDataset(encode(texts, description), labels, description)
    return train, TextDataset(encode(val_texts, description), val_labels, description), len(classes)


def build_labeled_set(args) -> Labeled:
    """--folds: train.csv's texts and val.csv's together, the classes from all of them (a fold's vocabulary from its
    own training texts); each text's
    id (the id column, else train.csv:<row>, 1 for the first row after the header), stratum (its class) and group
    (--group-column's value)."""
    if args.synthetic:
        train, val, outputs = synthetic_datasets(args.seed)
        dataset = TextDataset(train.token_ids + val.token_ids, train.labels + val.labels, train.description)
        return Labeled(dataset, outputs, [f"synthetic:{n}" for n in range(len(dataset))], dataset.labels)
    root = dataset_root(args.data_dir, "train.csv")
    if not (root / "train.csv").is_file():
        raise UserError(f"{root / 'train.csv'} not found: --data-dir needs train.csv (columns text and label)")
    group = getattr(args, "group_column", None)
    texts, names, ids, groups = [], [], [], []
    for path in (root / "train.csv", root / "val.csv"):
        rows = read_rows(path, ("text", "label", *([group] if group else []))) if path.is_file() else []
        for number, (line, row) in enumerate(rows, 1):
            names.append((row["label"] or "").strip())
            if not names[-1]:
                raise UserError(f"{path} line {line}: no label: give every text its class name, or remove the row")
            texts.append(row["text"] or "")
            ids.append((row.get("id") or "").strip() or f"{path.name}:{number}")
            groups += [(row[group] or "").strip()] if group else []
    classes = sorted(set(names))
    labels = [classes.index(name) for name in names]

    def parts(train: list[int], val: list[int]) -> tuple[TextDataset, TextDataset]:
        """A fold's sets, its vocabulary from its own training texts (the classes from all of them)."""
        description = describe(classes, build_vocabulary([texts[i] for i in train]))
        return tuple(
            TextDataset(encode([texts[i] for i in part], description), [labels[i] for i in part], description)
            for part in (train, val)
        )

    return Labeled(None, len(classes), ids, labels, groups or None, parts=parts)


def read_rows(path: Path, columns: tuple[str, ...], skip_blank: bool = True) -> list[tuple[int, dict]]:
    """(line number, row as a dict) of every row of a CSV file with a header row holding `columns`; `skip_blank`:
    without the rows whose fields are all empty (",,", what spreadsheets leave at the end)."""
    # utf-8-sig: spreadsheet programs start their CSV files with a byte-order mark.
    with open(path, newline="", encoding="utf-8-sig") as file:
        reader = csv.DictReader(file)
        try:
            header = [name.strip() for name in reader.fieldnames or []]
            header = ["id" if name.lower() == "id" else name for name in header]  # (Id, ID: other spellings of it)
            missing = [name for name in columns if name not in header]
            if missing:
                raise UserError(
                    f"{path} has no column {' or '.join(map(repr, missing))}: its header row is "
                    f"{','.join(header)!r}, and it needs {', '.join(columns)}"
                )
            reader.fieldnames = header
            rows = [
                (reader.line_num, row)
                for row in reader
                if not skip_blank or any((row.get(name) or "").strip() for name in header)
            ]
        except (UnicodeDecodeError, csv.Error) as error:
            raise UserError(f"{path} cannot be read as CSV text ({error}): save it as a UTF-8 CSV file") from None
    if not rows:
        raise UserError(f"{path} has a header row but no rows")
    for line, row in rows:  # (csv puts values past the header under None, and None for those missing)
        values = len(row.get(None, [])) + sum(value is not None for name, value in row.items() if name is not None)
        if values != len(header):
            raise UserError(
                f"{path} line {line}: {values} values, but the header has {len(header)} columns: put a text that "
                'holds a comma in double quotes, and double a quote inside it ("")'
            )
    return rows


def read_labelled(path: Path) -> tuple[list[str], dict[int, str]]:
    """The texts of a CSV file of texts and labels, and the label of each, by line number."""
    texts, labels = [], {}
    for line, row in read_rows(path, ("text", "label")):
        label = (row["label"] or "").strip()
        if not label:
            raise UserError(f"{path} line {line}: no label: give every text its class name, or remove the row")
        texts.append(row["text"] or "")
        labels[line] = label
    return texts, labels


def class_index(name: str, index: dict[str, int], path: Path, line: int) -> int:
    """A validation label's class index; a class train.csv does not have is an error naming the row."""
    if name not in index:
        raise UserError(
            f"{path} line {line}: label {name!r} is not a class of train.csv ({', '.join(index)}): "
            "fix the row, or add texts of that class to train.csv"
        )
    return index[name]


def synthetic_datasets(seed: int) -> tuple[TextDataset, TextDataset, int]:
    """Random texts of words w2, w3, ...: each class uses words of its own more often, so they can be learned."""
    rng = np.random.default_rng(seed)
    vocabulary = SPECIAL + [f"w{index}" for index in range(len(SPECIAL), SYNTHETIC_WORDS)]
    preferred = rng.choice(np.arange(len(SPECIAL), SYNTHETIC_WORDS), (SYNTHETIC_CLASSES, 20), replace=False)
    labels = rng.integers(0, SYNTHETIC_CLASSES, SYNTHETIC_TRAIN + SYNTHETIC_VAL)
    token_ids = []
    for label in labels:
        length = int(rng.integers(4, 40))
        ids = rng.integers(len(SPECIAL), SYNTHETIC_WORDS, length)
        ours = rng.random(length) < 0.25
        ids[ours] = rng.choice(preferred[label], int(ours.sum()))
        token_ids.append(ids.astype(np.int64))
    classes = [str(label) for label in range(SYNTHETIC_CLASSES)]
    description = describe(classes, vocabulary)
    labels = labels.tolist()
    train = TextDataset(token_ids[:SYNTHETIC_TRAIN], labels[:SYNTHETIC_TRAIN], description)
    val = TextDataset(token_ids[SYNTHETIC_TRAIN:], labels[SYNTHETIC_TRAIN:], description)
    return train, val, SYNTHETIC_CLASSES


def predict_csv(source: Path) -> Path:
    """The CSV file to predict: `source`, or the one CSV file in the folder `source` (an extracted archive)."""
    if not source.is_dir():
        return source
    found = sorted(path for path in source.glob("*.csv") if not is_junk(path.name) and not path.name.startswith("."))
    if len(found) != 1:
        raise UserError(f"--input {source} is a folder holding {len(found)} CSV files: pass the CSV file of texts")
    return found[0]


def build_predict_set(source: Path, description: dict) -> tuple[TextDataset, list[str]]:
    """predict.py's inputs: the texts of the CSV file `source` (columns id, or Id or ID, and text; without id, the
    row number from 0), read as training read its texts (the checkpoint's `description`), in the file's order; and
    their ids."""
    path = predict_csv(source)
    rows = read_rows(path, ("text",), skip_blank=False)  # an empty text is an input too: it gets its row
    keys = [(row["id"] or "").strip() if "id" in row else str(number) for number, (_, row) in enumerate(rows)]
    texts = [row["text"] or "" for _, row in rows]
    return TextDataset(encode(texts, description), None, description), keys
