"""The text task: CSV files of texts and labels in, token-id batches as dicts, the ROC AUC, predictions as a CSV."""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import write_csv

from {{ cookiecutter.project_slug }} import data, inference, seam, task
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.model import build_model

CLASSES = ("files", "network", "numbers")
WORDS = {
    "files": "path file directory folder read write",
    "network": "socket host port address connect send",
    "numbers": "integer float decimal round sum digits",
}


def texts_of(label: str, count: int, first: int = 0) -> list[list]:
    """`count` rows `id,text,label` whose texts use their class's words."""
    words = WORDS[label].split()
    return [[f"{label}-{first + n}", f"The {words[n % 6]} and {words[(n + 1) % 6]} {n}", label] for n in range(count)]


def args_for(folder: Path) -> argparse.Namespace:
    return argparse.Namespace(data_dir=str(folder), synthetic=False, seed=0, val_fraction=0.1)


@pytest.fixture
def texts(tmp_path) -> Path:
    """A data folder: train.csv of 10 texts per class, val.csv of 3."""
    header = ["id", "text", "label"]
    write_csv(tmp_path / "train.csv", header, [row for label in CLASSES for row in texts_of(label, 10)])
    write_csv(tmp_path / "val.csv", header, [row for label in CLASSES for row in texts_of(label, 3, first=10)])
    return tmp_path


def test_the_vocabulary_is_padding_unknown_then_the_words_seen_twice_most_frequent_first():
    vocabulary = data.build_vocabulary(["the cat, the dog", "The Dog and the bird", "once"])

    assert vocabulary == ["<pad>", "<unk>", "the", "dog"]


def test_texts_become_ids_of_the_vocabulary_unknown_words_1_cut_to_the_max_length():
    description = {"vocabulary": ["<pad>", "<unk>", "the", "dog"], "max_length": 3}

    ids = data.encode(["The dog bites the dog", "", "A DOG"], description)

    assert [row.tolist() for row in ids] == [[2, 3, 1], [], [1, 3]]
    assert all(row.dtype == np.int64 for row in ids)


def test_a_batch_is_a_dict_of_ids_padded_to_its_longest_text_a_mask_of_its_tokens_and_labels(texts):
    train_set, _, _ = data.build_datasets(args_for(texts))
    samples = [{"input_ids": np.array([5, 6, 7]), "labels": 2}, {"input_ids": np.array([8]), "labels": 0}]

    batch = train_set.collate(samples)

    assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
    assert np.asarray(batch["input_ids"]).tolist() == [[5, 6, 7], [8, 0, 0]]
    assert np.asarray(batch["attention_mask"]).tolist() == [[1, 1, 1], [1, 0, 0]]
    assert np.asarray(batch["labels"]).tolist() == [2, 0]
    assert {str(np.asarray(value).dtype) for value in batch.values()} == {"int64"}


def test_the_datasets_read_train_and_val_csv_with_class_names_sorted_and_the_vocabulary_described(texts):
    train_set, val_set, num_classes = data.build_datasets(args_for(texts))

    assert (len(train_set), len(val_set), num_classes) == (30, 9, 3)
    assert train_set.description["classes"] == list(CLASSES)
    assert train_set.description["vocab_size"] == len(train_set.description["vocabulary"])
    assert val_set[0]["labels"] == 0 and val_set[len(val_set) - 1]["labels"] == 2


def test_without_val_csv_a_part_of_each_class_is_held_out(texts):
    (texts / "val.csv").unlink()

    train_set, val_set, _ = data.build_datasets(args_for(texts))

    assert (len(train_set), len(val_set)) == (27, 3)
    assert sorted(val_set[i]["labels"] for i in range(3)) == [0, 1, 2]  # one of each class of 10 at 0.1


def test_the_held_out_rows_are_the_same_for_a_seed_and_never_a_whole_class():
    labels = [0] * 10 + [1] * 30 + [2]

    train, val = data.split_by_label(labels, 0.1, seed=0)

    assert (train, val) == data.split_by_label(labels, 0.1, seed=0)
    assert val != data.split_by_label(labels, 0.1, seed=1)[1]
    assert sorted(labels[i] for i in val) == [0, 1, 1, 1]  # 10% of each class, a class of one kept whole
    assert sorted(train + val) == list(range(len(labels)))


def test_a_missing_train_csv_is_one_line_naming_it(tmp_path):
    with pytest.raises(UserError, match=r"train\.csv not found") as raised:
        data.build_datasets(args_for(tmp_path))

    assert str(tmp_path / "train.csv") in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("column", ["text", "label"])
def test_a_missing_column_is_one_line_naming_the_file_and_the_column(texts, column):
    header = [name for name in ("id", "text", "label") if name != column]
    write_csv(texts / "train.csv", header, [["1", "words"]])

    with pytest.raises(UserError, match=f"train.csv has no column '{column}'") as raised:
        data.build_datasets(args_for(texts))

    assert str(texts / "train.csv") in str(raised.value) and "\n" not in str(raised.value)


def test_an_unknown_label_in_val_csv_is_one_line_naming_its_row(texts):
    rows = texts_of("files", 2, first=10) + [["x", "a socket", "sockets"]]
    write_csv(texts / "val.csv", ["id", "text", "label"], rows)

    with pytest.raises(UserError, match=r"val\.csv line 4: label 'sockets' is not a class of train\.csv") as raised:
        data.build_datasets(args_for(texts))

    assert "\n" not in str(raised.value)


def test_a_row_without_a_label_is_one_line_naming_its_row(texts):
    rows = texts_of("files", 2) + [["x", "a text", " "]]
    write_csv(texts / "train.csv", ["id", "text", "label"], rows)

    with pytest.raises(UserError, match=r"train\.csv line 4: no label"):
        data.build_datasets(args_for(texts))


@pytest.mark.parametrize(
    "line, values",
    [('x,"a stray "quote, a comma",files', 4), ("x,a text with, a comma,files", 4), ("x,a text", 2)],
)
def test_a_row_of_more_or_fewer_values_than_the_header_is_one_line_naming_its_row(texts, line, values):
    with open(texts / "train.csv", "a", encoding="utf-8") as file:
        file.write(line + "\n")

    with pytest.raises(UserError, match=rf"train\.csv line 32: {values} values, but the header has 3 columns"):
        data.build_datasets(args_for(texts))
    with pytest.raises(UserError, match=r"train\.csv line 32"):
        data.build_labeled_set(args_for(texts))


def test_texts_to_predict_with_a_value_missing_are_one_line_naming_the_row(texts, tmp_path):
    train_set, _, num_classes = data.build_datasets(args_for(texts))
    source = tmp_path / "new.csv"
    source.write_text("id,text\nt0,hello world\nt1\n", encoding="utf-8")

    with pytest.raises(UserError, match=r"new\.csv line 3: 1 values, but the header has 2 columns"):
        data.build_predict_set(source, seam.data_description(train_set, num_classes))


def test_synthetic_texts_are_made_without_files_as_ids_of_their_own_vocabulary():
    train_set, val_set, num_classes = data.build_datasets(argparse.Namespace(synthetic=True, seed=0))

    vocab_size = train_set.description["vocab_size"]
    assert num_classes == len(train_set.description["classes"]) and len(val_set) > 0
    assert all(0 < int(train_set[i]["input_ids"].max()) < vocab_size for i in range(len(train_set)))


def brute_force_auc(scores, positive) -> float:
    """Every (positive, negative) pair: 1 where the positive scores higher, 1/2 for a tie."""
    pairs = [(p, n) for p in scores[positive] for n in scores[~positive]]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_the_auc_is_the_chance_a_positive_outscores_a_negative_ties_counting_half(num_classes):
    rng = np.random.default_rng(num_classes)
    probabilities = rng.random((60, num_classes)).round(1)  # rounded: many ties
    labels = np.arange(60) % num_classes

    if num_classes == 2:
        expected = brute_force_auc(probabilities[:, 1], labels == 1)
    else:
        expected = np.mean([brute_force_auc(probabilities[:, c], labels == c) for c in range(num_classes)])

    assert task.roc_auc(probabilities, labels) == pytest.approx(expected, rel=1e-12)


def test_metrics_give_the_loss_per_sample_the_accuracy_and_the_auc_of_the_whole_set():
    probabilities = np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
    labels = np.array([0, 1, 1, 0])

    results = task.metrics({"loss": np.float64(2.0), "correct": np.float64(2)}, {"probabilities": probabilities,
                           "labels": labels}, 4)  # fmt: skip

    assert results == {"loss": 0.5, "acc": 0.5, "auc": pytest.approx(0.5)}
    assert task.BEST_METRIC in results and task.BEST_MODE == "max"


def test_a_class_missing_from_the_validation_labels_makes_the_auc_nan_not_a_mean_of_the_others():
    probabilities = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.7, 0.2, 0.1]])

    assert math.isnan(task.roc_auc(probabilities, np.array([0, 1, 0])))


def test_the_description_survives_a_checkpoint_as_plain_values_and_reads_new_texts_as_training_did(texts, tmp_path):
    train_set, _, num_classes = data.build_datasets(args_for(texts))
    description = json.loads(json.dumps(seam.data_description(train_set, num_classes)))  # what a checkpoint keeps
    source = write_csv(tmp_path / "new.csv", ["text", "id"], [[row[1], row[0]] for row in texts_of("network", 2)])

    inputs, keys = data.build_predict_set(source, description)

    assert keys == ["network-0", "network-1"]
    assert [inputs[i]["input_ids"].tolist() for i in range(2)] == [train_set[i]["input_ids"].tolist() for i in (10, 11)]
    assert seam.Task().model_options(description) == {"vocab_size": len(description["vocabulary"])}


def test_texts_to_predict_without_an_id_column_are_numbered_from_0_in_the_files_order(texts, tmp_path):
    train_set, _, num_classes = data.build_datasets(args_for(texts))
    source = write_csv(tmp_path / "new.csv", ["text"], [["a socket"], [""], ["a file"]])

    inputs, keys = data.build_predict_set(source, seam.data_description(train_set, num_classes))

    assert keys == ["0", "1", "2"] and len(inputs) == 3


def test_texts_to_predict_with_an_id_column_spelled_id_or_ID_keep_their_ids(texts, tmp_path):
    train_set, _, num_classes = data.build_datasets(args_for(texts))
    description = seam.data_description(train_set, num_classes)

    for spelling in ("Id", "ID"):
        source = write_csv(tmp_path / f"{spelling}.csv", [spelling, "text"], [["t7", "a socket"], ["t9", "a file"]])
        _, keys = data.build_predict_set(source, description)
        assert keys == ["t7", "t9"], spelling


def test_texts_to_predict_without_a_text_column_are_one_line_naming_the_file(texts, tmp_path):
    train_set, _, num_classes = data.build_datasets(args_for(texts))
    source = write_csv(tmp_path / "new.csv", ["id", "body"], [["1", "a socket"]])

    with pytest.raises(UserError, match=r"new\.csv has no column 'text'"):
        data.build_predict_set(source, seam.data_description(train_set, num_classes))


def test_a_texts_prediction_does_not_depend_on_the_batch_it_is_padded_in(texts):
    train_set, _, num_classes = data.build_datasets(args_for(texts))
    model = build_model(num_classes, vocab_size=train_set.description["vocab_size"])
    model.eval()
    short, long = {"input_ids": np.array([2, 3])}, {"input_ids": np.array([4, 2, 5, 6, 7, 3, 1])}

    alone = inference.predict(model, train_set.collate([short]))
    padded = inference.predict(model, train_set.collate([long, short]))

    assert alone[0][0] == padded[1][0] and alone[0][1] == pytest.approx(padded[1][1], rel=1e-6)


def test_predictions_are_a_csv_of_id_and_label_in_the_inputs_order_with_the_probability_on_request(tmp_path):
    description = {"classes": list(CLASSES)}
    rows = [(2, 0.91234), (0, 0.5), (1, 0.75)]

    plain = task.write_predictions(str(tmp_path / "p.csv"), ["b", "a", "c"], rows, description, argparse.Namespace())
    chances = task.write_predictions(
        str(tmp_path / "q.csv"), ["b", "a", "c"], rows, description, argparse.Namespace(probabilities=True)
    )

    assert Path(plain).read_text(encoding="utf-8") == "id,label\nb,numbers\na,files\nc,network\n"
    assert Path(chances).read_text(encoding="utf-8").splitlines() == [
        "id,label,probability", "b,numbers,0.9123", "a,files,0.5000", "c,network,0.7500",
    ]  # fmt: skip


def test_a_file_that_is_not_utf8_csv_text_is_one_line_naming_it(texts):
    (texts / "train.csv").write_bytes(b"text,label\n\xff\xfe caf\xe9,files\n")

    with pytest.raises(UserError, match=r"train\.csv cannot be read as CSV text"):
        data.build_datasets(args_for(texts))
