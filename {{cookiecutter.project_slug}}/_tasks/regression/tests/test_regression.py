"""The regression task: a CSV table in, features standardised with the training rows' statistics, the RMSE and MAE in
the target's own units, predictions as a CSV of id and target."""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import write_csv

from {{ cookiecutter.project_slug }} import data, engine, inference, loaders, seam, task
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.model import build_model, build_optimizer

HEADER = ["id", "age", "bmi", "site", "target"]  # site: the same in every row


def patients(count: int, first: int = 0) -> list[list]:
    """`count` rows of HEADER: a target of about 150, linear in age and bmi."""
    rows = []
    for n in range(first, first + count):
        age, bmi = 20 + (n * 7) % 50, 18 + (n * 3) % 15
        rows.append([f"p{n}", age, bmi, 1, 2 * age + 3 * bmi + n % 5])
    return rows


def args_for(folder: Path, **flags) -> argparse.Namespace:
    options = {"data_dir": str(folder), "synthetic": False, "seed": 0, "val_fraction": 0.1, "target": "target"}
    return argparse.Namespace(**{**options, **flags})


def columns(dataset) -> tuple[np.ndarray, np.ndarray]:
    """A set's standardised features and its targets, as numpy arrays."""
    items = [dataset[index] for index in range(len(dataset))]
    return np.stack([np.asarray(features) for features, _ in items]), np.array([float(target) for _, target in items])


def on_cpu(batch):
    return loaders.to_device(batch, inference.pick_device("cpu"))


@pytest.fixture
def table(tmp_path) -> Path:
    """A data folder: train.csv of 40 patients, val.csv of 10."""
    write_csv(tmp_path / "train.csv", HEADER, patients(40))
    write_csv(tmp_path / "val.csv", HEADER, patients(10, first=40))
    return tmp_path


def test_features_are_standardised_with_the_training_rows_statistics_and_targets_keep_their_units(table):
    train_set, val_set, num_classes = data.build_datasets(args_for(table))

    assert (len(train_set), len(val_set), num_classes) == (40, 10, 1)
    assert train_set.description["features"] == ["age", "bmi", "site"]  # every column but id and the target
    train_features, train_targets = columns(train_set)
    assert train_features[:, :2].mean(axis=0) == pytest.approx([0, 0], abs=1e-6)
    assert train_features[:, :2].std(axis=0) == pytest.approx([1, 1], rel=1e-5)
    assert not train_features[:, 2].any()  # a constant column is 0, not nan
    raw = np.array([row[1:4] for row in patients(10, first=40)], dtype=float)
    mean, std = np.array(train_set.description["feature_mean"]), np.array(train_set.description["feature_std"])
    val_features, val_targets = columns(val_set)
    assert val_features == pytest.approx((raw - mean) / std, abs=1e-5)
    assert list(val_targets) == [row[4] for row in patients(10, first=40)]
    assert train_set.description["target_mean"] == pytest.approx(train_targets.mean())


def test_without_val_csv_a_val_fraction_of_the_rows_is_held_out_the_same_for_a_seed(table):
    (table / "val.csv").unlink()

    train_set, val_set, _ = data.build_datasets(args_for(table, val_fraction=0.25))
    again = data.build_datasets(args_for(table, val_fraction=0.25))[1]
    other = data.build_datasets(args_for(table, val_fraction=0.25, seed=1))[1]

    assert (len(train_set), len(val_set)) == (30, 10)
    assert list(columns(again)[1]) == list(columns(val_set)[1]) != list(columns(other)[1])
    held, kept = columns(val_set)[1], columns(train_set)[1]
    assert sorted([*held, *kept]) == sorted(row[4] for row in patients(40))


def test_target_names_the_column_to_learn_and_the_others_are_features(table):
    write_csv(table / "train.csv", ["a", "y", "target"], [[n, 2 * n, n % 3] for n in range(10)])
    (table / "val.csv").unlink()

    train_set, _, _ = data.build_datasets(args_for(table, target="y"))

    assert train_set.description["features"] == ["a", "target"] and train_set.description["target"] == "y"


def test_a_missing_train_csv_is_one_line_naming_it(tmp_path):
    with pytest.raises(UserError, match=r"train\.csv not found") as raised:
        data.build_datasets(args_for(tmp_path))

    assert str(tmp_path / "train.csv") in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_target_column_is_one_line_naming_the_file_and_the_flag(table):
    with pytest.raises(UserError, match=r"train\.csv has no column 'progression' .*: pass --target NAME") as raised:
        data.build_datasets(args_for(table, target="progression"))

    assert str(table / "train.csv") in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "value, said", [("thin", "'thin' is not a finite number"), ("", "the value is empty"), ("nan", "'nan' is not")]
)
def test_a_value_that_is_not_a_number_is_one_line_naming_the_file_the_line_and_the_column(table, value, said):
    rows = patients(3)
    rows[1][2] = value
    write_csv(table / "train.csv", HEADER, rows)

    with pytest.raises(UserError, match=rf"train\.csv line 3, column 'bmi': {said}") as raised:
        data.build_datasets(args_for(table))

    assert "\n" not in str(raised.value)


def test_a_val_csv_without_a_feature_of_train_csv_is_one_line_naming_both(table):
    write_csv(table / "val.csv", ["id", "age", "site", "target"], [["v", 30, 1, 100]])

    with pytest.raises(UserError, match=r"val\.csv has no column 'bmi': it needs the columns age, bmi, site, target"):
        data.build_datasets(args_for(table))


def test_a_row_of_another_length_than_the_header_is_one_line_naming_its_line(table):
    (table / "train.csv").write_text("age,target\n30,100\n\n40,120,7\n", encoding="utf-8")

    with pytest.raises(UserError, match=r"train\.csv line 4: 3 values, but the header has 2 columns"):
        data.build_datasets(args_for(table))


@pytest.mark.parametrize("name", ["train.csv", "val.csv"])
def test_a_file_with_a_header_but_no_rows_is_one_line_naming_it(table, name):
    write_csv(table / name, HEADER, [])

    with pytest.raises(UserError, match=rf"{name} has a header row but no rows"):
        data.build_datasets(args_for(table))


def test_a_file_that_is_not_utf8_csv_text_is_one_line_naming_it(table):
    (table / "train.csv").write_bytes(b"age,target\n\xff\xfe,1\n")

    with pytest.raises(UserError, match=r"train\.csv cannot be read as CSV text"):
        data.build_datasets(args_for(table))


def test_the_metrics_are_the_rmse_and_mae_in_the_targets_units_and_the_loss_in_standard_deviations(table):
    train_set, val_set, num_classes = data.build_datasets(args_for(table))
    model = build_model(num_classes, **seam.Task().model_options(train_set.description))
    model.eval()
    features, targets = columns(val_set)
    predictions = np.array(inference.predict(model, features.astype(np.float32)))

    parts = []
    for number, rows in enumerate((slice(0, 6), slice(6, 10))):  # two batches, as evaluation deals them
        batch = on_cpu((features[rows].astype(np.float32), targets[rows].astype(np.float32)))
        sums, per_sample = task.validation_step(model, batch)
        parts.append((number, {name: np.float64(float(value.detach())) for name, value in sums.items()}, per_sample))
    results = seam.Task(task=task).metrics(parts, len(targets))

    errors = predictions - targets
    std = train_set.description["target_std"]
    assert results["rmse"] == pytest.approx(math.sqrt(np.mean(errors**2)), rel=1e-5)
    assert results["mae"] == pytest.approx(np.mean(np.abs(errors)), rel=1e-5)
    assert results["loss"] == pytest.approx(np.mean((errors / std) ** 2), rel=1e-5)
    assert (task.BEST_METRIC, task.BEST_MODE) == ("rmse", "min")


def test_the_model_answers_in_the_targets_units_and_learns_on_the_standardised_scale():
    model = build_model(1, num_features=2, target_mean=1000.0, target_std=50.0)
    model.eval()
    features = np.zeros((3, 2), np.float32)
    targets = np.array([900.0, 1000.0, 1200.0], np.float32)
    untrained = np.array(inference.predict(model, features))

    loss = float(task.training_loss(model, on_cpu((features, targets))).detach())

    assert untrained == pytest.approx(untrained[0]) and abs(untrained[0] - 1000) < 50  # near the mean, in units
    assert loss == pytest.approx(np.mean(((untrained - targets) / 50) ** 2), rel=1e-5)


def trained_rmse(target_scale: float, target_shift: float) -> float:
    """The validation RMSE after a short training on the synthetic table with its target scaled and shifted."""
    names, train, val = data.synthetic_table(seed=0)
    train[:, -1], val[:, -1] = train[:, -1] * target_scale + target_shift, val[:, -1] * target_scale + target_shift
    description = data.describe(names, "target", train)
    engine.seed_everything(0)
    model = build_model(1, **seam.Task().model_options(description))
    optimizer = build_optimizer(model, 0.01)
    features, targets = data.standardised(train[:, :-1], description).astype(np.float32), train[:, -1]
    for start in range(0, len(train), 64):
        loss = task.training_loss(model, on_cpu((features[start : start + 64], targets[start : start + 64])))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad() if hasattr(optimizer, "clear_grad") else optimizer.zero_grad()  # Paddle, PyTorch
    model.eval()
    predictions = np.array(inference.predict(model, data.standardised(val[:, :-1], description).astype(np.float32)))
    return math.sqrt(np.mean((predictions - val[:, -1]) ** 2))


def test_a_target_in_the_thousands_trains_as_well_as_one_near_1():
    near_1 = trained_rmse(1 / 30, -100 / 30)  # the synthetic target, about 100 +- 30, made about 0 +- 1
    thousands = trained_rmse(100.0, 5000.0)

    assert thousands / near_1 == pytest.approx(3000, rel=1e-3)


def test_synthetic_rows_are_a_learnable_table_of_8_features_without_files(tmp_path):
    train_set, val_set, num_classes = data.build_datasets(args_for(tmp_path / "none", synthetic=True))
    (features, targets), (val_features, val_targets) = columns(train_set), columns(val_set)

    fit = np.linalg.lstsq(np.column_stack([features, np.ones(len(features))]), targets, rcond=None)[0]
    val_rmse = math.sqrt(
        np.mean((np.column_stack([val_features, np.ones(len(val_features))]) @ fit - val_targets) ** 2)
    )

    assert features.shape[1] == train_set.description["num_features"] == 8 and num_classes == 1
    assert val_rmse < 0.3 * val_targets.std()  # mostly learnable: the noise is a small part of the spread
    assert not (tmp_path / "none").exists()


def test_the_description_survives_a_checkpoint_as_plain_values_and_reads_new_rows_as_training_did(table):
    train_set, val_set, num_classes = data.build_datasets(args_for(table))
    description = json.loads(json.dumps(seam.data_description(train_set, num_classes)))  # what a checkpoint keeps

    inputs, keys = data.build_predict_set(table / "val.csv", description)

    assert keys == [f"p{n}" for n in range(40, 50)]
    assert np.stack([np.asarray(inputs[i]) for i in range(len(inputs))]) == pytest.approx(columns(val_set)[0])
    assert seam.Task().model_options(description) == {
        "num_features": 3, "target_mean": description["target_mean"], "target_std": description["target_std"],
    }  # fmt: skip


def test_rows_to_predict_without_an_id_are_numbered_from_0_their_columns_in_any_order_others_ignored(table, tmp_path):
    train_set, _, num_classes = data.build_datasets(args_for(table))
    source = write_csv(tmp_path / "new.csv", ["note", "site", "bmi", "age"], [["x", 1, 20, 30], ["y", 1, 25, 60]])

    inputs, keys = data.build_predict_set(source, seam.data_description(train_set, num_classes))

    assert keys == ["0", "1"]
    mean, std = np.array(train_set.description["feature_mean"]), np.array(train_set.description["feature_std"])
    assert np.asarray(inputs[1]) == pytest.approx((np.array([60, 25, 1]) - mean) / std, abs=1e-5)


def test_an_id_column_spelled_id_or_ID_is_the_rows_ids_in_training_and_predicting_not_a_feature(tmp_path):
    header = ["Id", *HEADER[1:]]  # Kaggle's spelling (House Prices)
    write_csv(tmp_path / "train.csv", header, patients(40))
    train_set, _, num_classes = data.build_datasets(args_for(tmp_path, val_fraction=0.25))
    labeled = data.build_labeled_set(args_for(tmp_path, folds=2))
    source = write_csv(tmp_path / "test.csv", ["ID", "age", "bmi", "site"], [["q1", 30, 20, 1], ["q2", 60, 25, 1]])

    _, keys = data.build_predict_set(source, seam.data_description(train_set, num_classes))

    assert train_set.description["features"] == ["age", "bmi", "site"]
    assert labeled.ids[:2] == ["p0", "p1"]
    assert keys == ["q1", "q2"]


def test_a_folder_holding_one_csv_file_beside_junk_predicts_its_rows(table, tmp_path):
    train_set, _, num_classes = data.build_datasets(args_for(table))
    folder = tmp_path / "unpacked"  # as predict.py leaves an archive of test.csv
    folder.mkdir()
    write_csv(folder / "test.csv", HEADER, patients(4))
    (folder / "._test.csv").write_bytes(b"\x00\x05\x16\x07")  # what macOS adds beside it

    inputs, keys = data.build_predict_set(folder, seam.data_description(train_set, num_classes))

    assert len(inputs) == 4 and keys == ["p0", "p1", "p2", "p3"]


@pytest.mark.parametrize(
    "header, row, said",
    [
        (["id", "age", "site"], ["a", 30, 1], r"new\.csv has no column 'bmi'"),
        (
            ["id", "age", "bmi", "site"],
            ["a", 30, "?", 1],
            r"new\.csv line 2, column 'bmi': '\?' is not a finite number",
        ),
    ],
)
def test_rows_to_predict_with_a_missing_column_or_a_bad_value_are_one_line_naming_it(
    table, tmp_path, header, row, said
):
    train_set, _, num_classes = data.build_datasets(args_for(table))
    source = write_csv(tmp_path / "new.csv", header, [row])

    with pytest.raises(UserError, match=said):
        data.build_predict_set(source, seam.data_description(train_set, num_classes))


def test_predictions_are_a_csv_of_id_and_the_target_by_its_name_in_the_inputs_order(tmp_path):
    description = {"target": "progression"}
    rows = [151.2345678, 75.0, -0.5]

    written = task.write_predictions(str(tmp_path / "p.csv"), ["b", "a", "7"], rows, description, argparse.Namespace())

    assert Path(written).read_text(encoding="utf-8") == "id,progression\nb,151.23457\na,75.0\n7,-0.5\n"


def test_a_sample_submission_gives_the_file_its_header_and_its_row_order(tmp_path):
    sample = write_csv(tmp_path / "sample.csv", ["Id", "Expected"], [["a", 0], ["7", 0], ["b", 0]])
    options = argparse.Namespace(sample_submission=str(sample))

    written = task.write_predictions(str(tmp_path / "p.csv"), ["b", "a", "7"], [1.5, 2.5, 3.5], {}, options)

    assert Path(written).read_text(encoding="utf-8") == "Id,Expected\na,2.5\n7,3.5\nb,1.5\n"
