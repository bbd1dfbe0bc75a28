"""The seam to the user's three files, framework-free: best.* by the metric and direction task.py states, one-line
errors for a task that cannot work, metrics combined in batch order, and what the data description passes on."""

import functools
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from {{ cookiecutter.project_slug }} import batches, seam
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.state import TrainingState


def bests(values: list[float], metric: str = "rmse", mode: str = "min") -> list[bool]:
    """finish_epoch()'s verdict for each epoch's value of `metric`, in order."""
    state = TrainingState(best_metric=metric, best_mode=mode)
    return [state.finish_epoch(epoch, {"loss": 1.0, metric: value}) for epoch, value in enumerate(values, 1)]


def test_a_min_metric_is_best_when_lower_and_a_tie_keeps_the_earlier_epoch():
    assert bests([60.0, 55.0, 57.0, 55.0, 54.0]) == [True, True, False, False, True]


def test_a_max_metric_is_best_when_higher():
    assert bests([0.5, 0.4, 0.7], metric="auc", mode="max") == [True, False, True]


def test_a_value_that_is_not_finite_is_never_best_and_is_said(caplog):
    with caplog.at_level(logging.INFO):
        verdicts = bests([math.nan, 0.6, math.inf, 0.5], metric="auc", mode="max")

    assert verdicts == [False, True, False, False]
    said = [record.getMessage() for record in caplog.records if "not a number to compare" in record.getMessage()]
    assert len(said) == 2 and "val_auc is nan at epoch 1" in said[0]


def test_a_best_chosen_by_another_metric_starts_afresh_on_resume(caplog):
    resumed = TrainingState(epochs_done=3, best_value=0.9, best_metric="acc", best_mode="max")

    with caplog.at_level(logging.INFO):
        resumed.choose_best_by("rmse", "min")

    assert (resumed.best_metric, resumed.best_mode, resumed.best_value) == ("rmse", "min", None)
    assert "chosen by val_acc (max) and is now chosen by val_rmse (min)" in caplog.text


class Task:
    BEST_METRIC, BEST_MODE = "acc", "max"

    @staticmethod
    def metrics(sums, per_sample, count):
        return {"loss": sums["loss"] / count, "acc": sums["correct"] / count}


@pytest.mark.parametrize(
    "metric, mode, message",
    [
        ("", "max", "BEST_METRIC is ''"),
        ("acc", "maximum", "BEST_MODE is 'maximum': set it to 'max' (higher is better) or 'min'"),
        ("acc", None, "BEST_MODE is None"),
    ],
)
def test_a_task_whose_best_metric_or_direction_is_not_stated_is_one_line(metric, mode, message):
    task = type("Broken", (), {"BEST_METRIC": metric, "BEST_MODE": mode})
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        seam.Task(task=task)


@pytest.mark.parametrize(
    "functions, named, not_named",
    [
        (("rows_from_outputs",), "task.py has no test_time_views() (the views of a batch to average): add it ", "rows"),
        ((), "task.py has no test_time_views() (the views of a batch to average) and no rows_from_outputs() (", None),
    ],
)
def test_tta_without_the_functions_it_needs_is_one_line_naming_only_those_missing(functions, named, not_named):
    stated = dict.fromkeys(functions) | {"BEST_METRIC": "acc", "BEST_MODE": "max"}
    task = type("Plain", (), stated)
    with pytest.raises(UserError) as error:
        seam.Task(task=task).check_averaging(1, tta=True)
    message = str(error.value)
    assert message.startswith(f"--tta: {named}") and "\n" not in message
    assert not_named is None or not_named not in message


def test_metrics_without_the_best_metric_are_one_line_naming_the_function():
    task = type("Broken", (Task,), {"BEST_METRIC": "f1"})
    with pytest.raises(UserError, match=r"task.metrics\(\) returned \['acc', 'loss'\], without 'f1'"):
        seam.Task(task=task).metrics([(0, {"loss": 1.0, "correct": 3.0}, {})], 4)


def test_sums_add_in_batch_order_and_per_sample_values_come_back_in_dataset_order():
    task = type("Gathering", (Task,), {"metrics": staticmethod(lambda sums, per_sample, count: {
        "loss": float(sums["loss"]), "acc": 0.0, "order": float("".join(map(str, per_sample["index"])))})})  # fmt: skip
    # As two ranks deal them: rank 0 batches 0 and 2, rank 1 batch 1; gathered rank by rank.
    parts = [(0, {"loss": 1.0}, {"index": np.array([1, 2])}), (2, {"loss": 3.0}, {"index": np.array([5])}),
             (1, {"loss": 2.0}, {"index": np.array([3, 4])})]  # fmt: skip

    assert seam.Task(task=task).metrics(parts, 5) == {"loss": 6.0, "acc": 0.0, "order": 12345.0}


@pytest.mark.parametrize(
    "batch, structure",
    [
        ((np.zeros((4, 3)), np.zeros(4)), "tuple(ndarray[4, 3], ndarray[4])"),
        ({"input_ids": np.zeros((2, 7)), "labels": [1, 2]}, "{'input_ids': ndarray[2, 7], 'labels': list(int, int)}"),
    ],
)
def test_a_batch_the_task_cannot_read_is_one_line_naming_the_function_and_the_batch(batch, structure):
    def training_loss(model, batch):
        images, labels, extra = batch  # expects three parts
        return images

    with pytest.raises(UserError) as error, seam.calling("training_loss", batch):
        training_loss(None, batch)
    assert str(error.value).startswith(f"task.training_loss() failed on a batch of {structure} (ValueError: ")


def test_a_loss_that_is_not_a_scalar_is_one_line():
    task = type("NotAScalar", (Task,), {"training_loss": staticmethod(lambda model, batch: np.zeros(8))})
    with pytest.raises(UserError, match=r"returned ndarray\[8\] for a batch of ndarray\[8, 2\]: it must return"):
        seam.Task(task=task).training_loss(None, np.zeros((8, 2)))


def test_the_data_description_of_a_dataset_that_says_nothing_is_the_networks_outputs():
    assert seam.data_description(object(), 2) == {"num_classes": 2}


def test_a_datasets_own_description_is_kept_as_it_is_with_the_class_count():
    description = {"columns": ["age", "bmi"], "mean": [50.0, 26.0]}
    table = type("Table", (), {"description": description})()

    assert seam.data_description(table, 1) == {"columns": ["age", "bmi"], "mean": [50.0, 26.0], "num_classes": 1}


def wide_cnn(num_classes, channels=3, width=128):
    return num_classes, channels, width


def with_model(build_model) -> seam.Task:
    return seam.Task(model=type("Model", (), {"build_model": staticmethod(build_model)}))


def test_model_options_of_the_command_line_go_over_the_datas_and_the_checkpoint_keeps_them_for_predicting():
    task = with_model(wide_cnn)
    options = task.chosen_options([("width", 4096), ("channels", 1), ("width", 512)])  # the last one wins
    images = type("Images", (), {"description": dict(channels=3)})()
    saved = json.loads(json.dumps(seam.data_description(images, 2, options)))  # plain values, as a checkpoint holds

    assert task.network(saved) == (2, 1, 512)
    assert "model_options" not in seam.data_description(images, 2, task.chosen_options([]))


def test_a_model_option_build_model_does_not_take_is_one_line_naming_those_it_takes():
    for name in ("depth", "num_classes"):  # num_classes comes from the data
        with pytest.raises(UserError) as error:
            with_model(wide_cnn).chosen_options([(name, 3)])
        assert str(error.value) == (
            f"--model-option {name}: build_model() in model.py takes no such parameter; it takes channels, width"
        )
    assert with_model(lambda num_classes, **options: None).chosen_options([("depth", 3)]) == {"depth": 3}


@pytest.mark.parametrize("value", ["abc", 2.5, True, None])
def test_a_model_option_of_another_kind_than_its_number_default_is_one_line(value):
    with pytest.raises(UserError) as error:
        with_model(wide_cnn).chosen_options([("width", value)])
    assert str(error.value) == (
        f"--model-option width={value}: build_model() in model.py takes width as a whole number (its default is 128)"
    )


def test_a_model_option_without_a_number_default_takes_any_value_and_a_float_one_takes_a_whole_number():
    def build_model(num_classes, dropout=0.1, activation="relu", norm=None, pretrained=False):
        return num_classes

    options = [("dropout", 0), ("activation", "gelu"), ("norm", "batch"), ("pretrained", True)]
    assert with_model(build_model).chosen_options(options) == dict(options)


def test_model_options_fill_only_the_arguments_build_model_takes():
    description = {"classes": ["a"], "image_size": 28, "channels": 1, "vocab_size": 900, "num_classes": 1}

    def plain(num_classes):
        return num_classes

    def with_channels(num_classes, channels=3):
        return num_classes, channels

    def for_text(num_classes, vocab_size):
        return num_classes, vocab_size

    assert with_model(plain).model_options(description) == {}
    assert with_model(with_channels).model_options(description) == {"channels": 1}
    assert with_model(for_text).network(description, 2) == (2, 900)
    assert with_model(with_channels).model_options({**description, "channels": None}) == {}  # not known: the default
    targets = with_model(lambda num_classes, target_mean=1.0: None)
    assert targets.model_options({"target_mean": 0.0}) == {"target_mean": 0.0}


def boxes(count: int) -> dict:
    return {"boxes": np.zeros((count, 4)), "label": 1}


@pytest.mark.parametrize(
    "batch, samples",
    [
        (np.zeros((8, 3)), 8),
        ((np.zeros((8, 3)), np.zeros(8)), 8),
        ([np.zeros((2, 3)), np.zeros(2)], 2),  # the default collate's list of parts
        ({"targets": [boxes(23 + i) for i in range(6)], "images": np.zeros((6, 3, 4, 4))}, 6),  # targets first
        ({"targets": [boxes(23) for _ in range(6)], "images": np.zeros((6, 3, 4, 4))}, 6),  # each of 23 boxes
        ((np.zeros((5, 3)), [np.zeros((7, 4)) for _ in range(5)]), 5),  # per-image arrays of 7 rows each
        ([{"x": np.zeros(3)} for _ in range(7)], 7),  # per-sample dicts
        ({"input_ids": np.zeros((4, 9)), "ids": ["a", "b", "c", "d"], "scale": 0.5}, 4),
        ((np.zeros((32, 5)), np.zeros(32), None), 32),
        ([{"image": np.zeros((32, 3))}, {"label": np.zeros(32)}], 32),  # the default collate of (dict, dict) samples
        ({"images": [np.zeros((3, 8, 8)) for _ in range(5)], "paths": [Path("a.png")] * 5}, 5),
        ({"x": np.zeros((4, 2)), "extra": []}, 4),
        ({"input_ids": np.zeros((4, 9)), "mask": np.zeros((4, 9)), "position_ids": np.zeros((1, 9))}, 4),
    ],
)
def test_a_batch_counts_its_samples_whatever_its_structure(batch, samples):
    assert batches.sample_count(batch) == samples


@pytest.mark.parametrize(
    "batch, problem",
    [
        ({"images": np.zeros((6, 3)), "labels": np.zeros(5)}, "its parts disagree on its number of samples"),
        ({1, 2}, "the loops cannot read a set"),
        ("text", "it holds no array"),
    ],
)
def test_a_batch_that_cannot_be_counted_is_one_line(batch, problem):
    with pytest.raises(UserError, match=problem):
        batches.sample_count(batch)


def test_per_sample_values_of_different_lengths_are_padded_with_minus_100_in_dataset_order_however_dealt():
    seen = []
    task = type("Tagging", (Task,), {"metrics": staticmethod(
        lambda sums, per_sample, count: seen.append(per_sample["tags"]) or {"loss": 0.0, "acc": 0.0})})  # fmt: skip
    tags = [np.array([[1, 2], [3, -100]]), np.array([[4, 5, 6]]), np.array([[7], [8]])]  # padded per batch

    for order in ([0, 1, 2], [0, 2, 1], [2, 1, 0]):  # one process; two (rank 0: 0 and 2); three, gathered rank by rank
        seam.Task(task=task).metrics([(number, {}, {"tags": tags[number]}) for number in order], 5)

    expected = [[1, 2, -100], [3, -100, -100], [4, 5, 6], [7, -100, -100], [8, -100, -100]]
    assert len(seen) == 3 and all(np.array_equal(tags, expected) for tags in seen)


def test_a_mask_of_different_lengths_is_padded_with_false_and_stays_a_mask():
    padded = seam.padded("mask", [np.array([[True, False]]), np.array([[True, True, True]])])

    assert padded.dtype == np.bool_ and padded.tolist() == [[True, False, False], [True, True, True]]


def test_values_whose_number_of_dimensions_changes_are_one_line():
    parts = [(0, {}, {"x": np.zeros((2, 3))}), (1, {}, {"x": np.zeros(2)})]
    with pytest.raises(UserError, match="per-sample 'x' has 1 and 2 dimensions in different batches"):
        seam.Task(task=Task).metrics(parts, 4)


def test_a_collate_error_becomes_a_batch_that_says_it_naming_the_collate():
    def collate(samples):
        return {"labels": [sample["label"] for sample in samples]}

    class Texts:
        def __getitem__(self, index):
            return {"text": str(index)}

    Texts.collate = staticmethod(collate)
    batch = batches.GuardedCollate(Texts(), None)([batches.GuardedDataset(Texts())[0]])

    with pytest.raises(UserError, match=r"collate\(\) in test_seam.py raised KeyError: 'label'$"):
        batches.sample_count(batch)


def test_a_partial_collate_that_makes_what_the_loops_cannot_read_is_named_by_its_function():
    def collate(samples, extra):
        return set(extra)

    class Texts:
        pass

    Texts.collate = functools.partial(collate, extra=[1])
    batch = batches.GuardedCollate(Texts(), None)([{"text": "a"}])

    with pytest.raises(UserError, match=r"collate\(\) in test_seam.py made a batch of set: the loops cannot read"):
        batches.sample_count(batch)
