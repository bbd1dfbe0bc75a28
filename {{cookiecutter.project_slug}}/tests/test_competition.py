"""A competition's runs: folds with out-of-fold predictions and the CV score (--folds, --fold, cv.py), early stopping
(--patience, --min-delta) and the K best checkpoints (--keep-best)."""

import argparse
import collections
import csv
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_of_project, free_port, run_bash, run_sh

from {{ cookiecutter.project_slug }} import batches, cli, folds, inference, loaders, output_folder, seam, settings, task, workspace
from {{ cookiecutter.project_slug }}.distributed import DistEnv
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.state import TrainingState


def keep(directory, epoch: int, value: float, mode: str = "min") -> None:
    """What a Checkpointer of --keep-best 2 does at the end of an epoch: its save, listed if it is among the two best."""
    kept = output_folder.Kept(epoch, value, 2, mode)
    if output_folder.enters_top(directory, kept):
        (directory / f"epoch-{epoch}.pt").write_text("a checkpoint")
        output_folder.record_top(directory, kept, f"epoch-{epoch}.pt")


def test_top_json_lists_the_two_best_best_first_and_removes_the_saves_it_no_longer_lists(tmp_path):
    for epoch, loss in enumerate([0.5, 0.3, 0.4, 0.3, 0.6], start=1):
        keep(tmp_path, epoch, loss)

    # Epoch 4 ties epoch 2: the earlier comes first; epoch 5 never entered.
    assert [(entry["epoch"], entry["value"]) for entry in output_folder.top(tmp_path)] == [(2, 0.3), (4, 0.3)]
    assert sorted(path.name for path in tmp_path.glob("epoch-*")) == ["epoch-2.pt", "epoch-4.pt"]


def test_a_metric_to_maximise_keeps_the_highest_values(tmp_path):
    for epoch, accuracy in enumerate([0.5, 0.7, 0.6], start=1):
        keep(tmp_path, epoch, accuracy, mode="max")

    assert [entry["epoch"] for entry in output_folder.top(tmp_path)] == [2, 3]


def test_a_sharded_save_pushed_out_of_the_top_stays_while_the_last_link_names_it(tmp_path):
    for epoch, loss in enumerate([0.3, 0.4, 0.5], start=1):
        folder = tmp_path / f"save-{epoch}"
        folder.mkdir()
        output_folder.publish(tmp_path, folder, is_best=epoch == 1, kept=output_folder.Kept(epoch, loss, 1, "min"))

    assert [entry["path"] for entry in output_folder.top(tmp_path)] == ["save-1"]
    assert sorted(path.name for path in tmp_path.glob("save-*")) == ["save-1", "save-3"]  # the best, and the last


def test_an_epoch_counts_as_stale_unless_it_improves_on_the_best_by_more_than_min_delta():
    state = TrainingState()
    stale = []
    for epoch, loss in enumerate([1.0, 0.95, 0.5, 0.49, 0.48], start=1):
        state.finish_epoch(epoch, {"loss": loss}, min_delta=0.1)
        stale.append(state.stale_epochs)

    assert stale == [0, 1, 0, 1, 2]
    assert state.best_value == 0.48  # the best checkpoint still follows every improvement
    assert not state.stops_early(3) and state.stops_early(2) and not state.stops_early(None)


@pytest.mark.slow
def test_patience_stops_every_rank_at_one_epoch_counting_across_a_resume_and_keep_best_lists_the_best(
    project_root, tmp_path
):
    output = tmp_path / "output"
    # No epoch improves by a million: each after the first is stale.
    flags = ["--patience", "2", "--min-delta", "1e6", "--keep-best", "2"]
    run_sh(project_root, output, "--epochs", "2", *flags)

    log = run_sh(project_root, output, "--epochs", "6", *flags)  # stale once before, once more at epoch 3
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [record["epoch"] for record in metrics] == [1, 2, 3]
    assert "stopped early after epoch 3: " in log and "(--patience 2)" in log
    assert "done: best" in log.split("stopped early after epoch 3: ")[1]

    rerun = run_sh(project_root, output, "--epochs", "6", *flags)
    assert "stopped early after epoch 3" in rerun and "done: best" in rerun
    assert len((output / "metrics.jsonl").read_text().splitlines()) == 3  # nothing trained

    checkpoints = output / "checkpoints"
    top = json.loads((checkpoints / "top.json").read_text())
    name, sign = f"val_{task.BEST_METRIC}", -1 if task.BEST_MODE == "max" else 1
    ranked = sorted(metrics, key=lambda record: (sign * record[name], record["epoch"]))
    assert [(entry["epoch"], entry["value"]) for entry in top] == [(one["epoch"], one[name]) for one in ranked[:2]]
    assert all((checkpoints / entry["path"]).exists() for entry in top)
    first = checkpoints / top[0]["path"]
    assert first.read_bytes() == (checkpoints / f"best{Path(first).suffix}").read_bytes()  # the best is the first


def test_stratified_folds_are_the_same_for_a_seed_and_differ_by_at_most_one_sample_per_stratum():
    strata = ["a"] * 10 + ["b"] * 7 + ["c"] * 2

    fold_of = folds.assign(strata, None, 3, seed=5)

    assert fold_of == folds.assign(strata, None, 3, seed=5) != folds.assign(strata, None, 3, seed=6)
    for stratum in "abc":
        sizes = collections.Counter(fold for fold, s in zip(fold_of, strata, strict=True) if s == stratum)
        assert max(sizes.values()) - min(sizes.get(fold, 0) for fold in range(3)) <= 1
    assert sorted(collections.Counter(fold_of).values()) == [6, 6, 7]


def test_grouped_folds_never_put_one_group_in_two_folds():
    groups = [f"patient-{n % 7}" for n in range(40)]

    fold_of = folds.assign([0] * 40, groups, 3, seed=0)

    assert all(len({f for f, g in zip(fold_of, groups, strict=True) if g == group}) == 1 for group in set(groups))
    assert set(fold_of) == {0, 1, 2}
    with pytest.raises(UserError, match="only 7 groups"):
        folds.assign([0] * 40, groups, 8, seed=0)


def test_a_target_falls_into_ten_quantile_bins_or_fewer_where_the_data_is_small():
    assert len(set(batches.quantile_bins(np.arange(1000.0), 5))) == 10
    assert len(set(batches.quantile_bins(np.arange(12.0), 5))) == 2  # at least 5 samples a bin


def test_a_fold_trains_in_its_own_folder_and_a_slurm_array_task_trains_the_fold_of_its_index(tmp_path):
    args = argparse.Namespace(output_dir=str(tmp_path), folds=5, fold="2")
    workspace.place_fold(args)
    assert (args.fold, args.output_dir, args.folds_dir) == (2, str(tmp_path / "fold-2"), str(tmp_path))

    array_task = argparse.Namespace(output_dir=str(tmp_path), folds=5, fold=None)
    workspace.place_fold(array_task, env={"SLURM_ARRAY_TASK_ID": "4"})
    assert array_task.output_dir == str(tmp_path / "fold-4")

    every = argparse.Namespace(output_dir=str(tmp_path), folds=5, fold=None)
    workspace.place_fold(every, env={})
    assert (every.fold, every.output_dir) == ("all", str(tmp_path))


@pytest.mark.parametrize("argv", [["--fold", "1"], ["--folds", "3", "--fold", "3"], ["--folds", "1"]])
def test_a_fold_that_cannot_be_is_refused_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args(argv)

    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_folds_csv_of_other_data_is_refused_in_one_line_naming_what_to_do(tmp_path):
    folds.write_folds(tmp_path / "folds.csv", ["a", "b", "c"], [0, 1, 0])

    assert folds.read_folds(tmp_path / "folds.csv", ["c", "b", "a"], 2) == [0, 1, 0]
    with pytest.raises(UserError, match="written for other data .1 ids differ.*new --output-dir"):
        folds.read_folds(tmp_path / "folds.csv", ["a", "b", "d", "c"], 2)


def rerun_of_two_finished_folds(directory: Path, folds_asked: int) -> argparse.Namespace:
    """DIR/folds.csv of the ids a, b, c in two folds, both finished; the options of a rerun with --folds asked."""
    folds.write_folds(directory / "folds.csv", ["a", "b", "c"], [0, 1, 0])
    for fold in (0, 1):
        for name in (folds.OOF, folds.CONTRIBUTIONS):
            (Path(folds.fold_dir(directory, fold)) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(folds.fold_dir(directory, fold)) / name).write_bytes(b"a finished fold's")
    args = argparse.Namespace(output_dir=str(directory), folds=folds_asked, fold=None)
    workspace.place_fold(args, env={})
    return args


def test_a_rerun_with_another_fold_count_is_refused_before_any_fold_is_said_finished(tmp_path):
    args = rerun_of_two_finished_folds(tmp_path, folds_asked=3)

    with pytest.raises(UserError, match="splits the data into 2 folds, not --folds 3"):
        folds.train_each(args, DistEnv(0, 0, 1, "cpu"), None, lambda run_args: pytest.fail("trained"), lambda: None)
    log = (tmp_path / "train.log").read_text(encoding="utf-8")  # (the package's logger does not propagate)
    assert "dist-template" in log and "is finished" not in log


def test_a_rerun_of_finished_folds_on_changed_data_is_refused_rather_than_scoring_the_old_folds(tmp_path):
    """The data is extracted first: a rerun in a fresh folder or container has only the archive."""
    args = rerun_of_two_finished_folds(tmp_path, folds_asked=2)
    extracted: list[str] = []  # the archive's ids, once extracted: one row deleted since the folds were trained
    one_row_deleted = argparse.Namespace(labeled_set=lambda args: batches.Labeled(None, 2, extracted, [0, 1]))

    with pytest.raises(UserError, match="written for other data .1 ids differ"):
        folds.train_each(
            args, DistEnv(0, 0, 1, "cpu"), one_row_deleted, lambda run_args: pytest.fail("trained"),
            lambda: extracted.extend(["a", "c"]),
        )  # fmt: skip
    assert not (tmp_path / folds.CV).exists()


def test_array_tasks_whose_folds_end_at_once_each_write_the_pooled_out_of_fold_rows_without_tripping(tmp_path):
    """Each array task whose fold ends last scores the folds, and writes DIR/oof.csv (the same rows): two at once
    once ended one of them in FileNotFoundError (both wrote one temporary file, and one of them had moved it)."""
    for fold in (0, 1):
        Path(folds.fold_dir(tmp_path, fold)).mkdir(parents=True)
        (Path(folds.fold_dir(tmp_path, fold)) / folds.OOF).write_text(f"id,p\n{fold},0.5\n", encoding="utf-8")

    def write_often() -> None:
        for _ in range(300):
            folds._write_pooled_rows(tmp_path, 2)

    writers = [multiprocessing.get_context("fork").Process(target=write_often) for _ in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert [writer.exitcode for writer in writers] == [0, 0]
    assert (tmp_path / folds.OOF).read_text(encoding="utf-8") == "id,p\n0,0.5\n1,0.5\n"
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.slow
def test_a_finished_fold_trained_on_to_more_epochs_predicts_its_fold_and_scores_the_folds_again(
    three_folds, project_root, tmp_path
):
    output = tmp_path / "output"
    shutil.copytree(three_folds[0], output, symlinks=True)
    written = [output / "fold-0" / folds.OOF, output / folds.OOF, output / folds.CV]
    for path in written:
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n", 1))  # a mark: any rewrite of the file removes it

    console = run_sh(project_root, output, "--folds", "3", "--fold", "0", "--epochs", "3")

    assert "epoch 3/3" in console and "cv: oof_" in console
    # The fold's out-of-fold predictions again, by its best of 3 epochs, and the pooled ones and the score with them.
    assert [b"\r\n" in path.read_bytes() for path in written] == [False, False, False]


@pytest.mark.slow
def test_three_folds_hold_every_labeled_sample_once_and_each_is_predicted_out_of_fold_once(three_folds, project_root):
    output, _ = three_folds
    assigned = list(csv.DictReader(open(output / "folds.csv", encoding="utf-8")))
    labeled = seam.Task().labeled_set(cli.parse_args(["--folds", "3", "--data-dir", str(output.parent / "data")]))
    assert sorted(row["id"] for row in assigned) == sorted(map(str, labeled.ids))
    sizes = collections.Counter(row["fold"] for row in assigned)
    assert max(sizes.values()) - min(sizes.values()) <= len(set(map(str, labeled.strata)))

    for fold in range(3):
        with open(output / f"fold-{fold}" / "oof.csv", encoding="utf-8") as file:
            rows = list(csv.reader(file))
        assert rows[0][-1] == "fold" and {row[-1] for row in rows[1:]} == {str(fold)}
        mine = {row["id"] for row in assigned if row["fold"] == str(fold)}
        assert {row[0] for row in rows[1:]} == mine  # each sample of the fold, and only those
    with open(output / "oof.csv", encoding="utf-8") as file:
        assert {row[0] for row in list(csv.reader(file))[1:]} == {row["id"] for row in assigned}


@pytest.mark.slow
def test_the_cv_score_pools_each_folds_best_validation_and_a_rerun_skips_the_finished_folds(three_folds, project_root):
    output, console = three_folds
    cv = json.loads((output / "cv.json").read_text())
    best, sign = task.BEST_METRIC, 1 if task.BEST_MODE == "max" else -1

    # Each fold's value is its best epoch's, as training validated it: the out-of-fold pass is the same validation.
    records = [[json.loads(line) for line in (output / f"fold-{k}" / "metrics.jsonl").open()] for k in range(3)]
    best_epochs = [max(fold, key=lambda record: sign * record[f"val_{best}"]) for fold in records]
    assert cv[f"fold_{best}"] == pytest.approx([record[f"val_{best}"] for record in best_epochs], rel=1e-9)
    # The loss is a mean over samples: pooled, it is the folds' losses weighted by their sizes.
    sizes = [record["val_samples"] for record in best_epochs]
    pooled_loss = sum(record["val_loss"] * size for record, size in zip(best_epochs, sizes, strict=True)) / sum(sizes)
    assert cv["oof_loss"] == pytest.approx(pooled_loss, rel=1e-9)
    assert f"cv: oof_{best} {cv[f'oof_{best}']:.4f}; folds " in console and "(3 folds)" in console

    again = run_sh(project_root, output, "--folds", "3", "--epochs", "2")
    assert again.count("is finished") == 3 and "epoch 1/2" not in again
    assert f"cv: oof_{best} {cv[f'oof_{best}']:.4f}" in again


LAGGING_FILE_SYSTEM = """

_finished = finished


def finished(directory, fold):  # noqa: F811 - a test: a shared file system that shows rank 1 no finished fold yet
    return _finished(directory, fold) and distributed.read_ranks()[0] != 1
"""


@pytest.mark.slow
def test_ranks_that_see_the_finished_folds_differently_skip_and_score_them_as_rank_0_sees_them(
    three_folds, project_root, tmp_path
):
    project = copy_of_project(project_root, tmp_path / "project", folds=LAGGING_FILE_SYSTEM)
    output = tmp_path / "output"
    shutil.copytree(three_folds[0], output, symlinks=True)

    console = run_sh(project, output, "--folds", "3", "--epochs", "2", "--dist-timeout", "60")

    assert console.count("is finished") == 3 and "epoch 1/2" not in console and "cv: oof_" in console


def test_predict_takes_top_json_a_run_a_folds_folder_of_finished_folds_and_checkpoints_as_given(tmp_path):
    keep(tmp_path, 1, 0.5)
    keep(tmp_path, 2, 0.3)
    folds.write_folds(tmp_path / "folds.csv", [str(n) for n in range(12)], [n % 11 for n in range(12)])
    for fold in range(11):
        (tmp_path / f"fold-{fold}" / "checkpoints").mkdir(parents=True)
        for name in (folds.OOF, folds.CONTRIBUTIONS):
            (tmp_path / f"fold-{fold}" / name).write_text("written once the fold was finished")

    def best_in(run):
        return run / "checkpoints" / "best.pt"

    top = folds.checkpoints_of([str(tmp_path / "top.json")], best_in)
    assert top == [tmp_path / "epoch-2.pt", tmp_path / "epoch-1.pt"]  # best first
    ensemble = folds.checkpoints_of([str(tmp_path)], best_in)
    assert ensemble == [tmp_path / f"fold-{fold}" / "checkpoints" / "best.pt" for fold in range(11)]  # fold order
    assert folds.checkpoints_of([str(tmp_path / "fold-3")], best_in) == [best_in(tmp_path / "fold-3")]
    assert folds.checkpoints_of(["a.pt", "b"], best_in) == [Path("a.pt"), Path("b")]
    (tmp_path / "fold-7" / folds.OOF).unlink()
    with pytest.raises(UserError, match="fold 7 of 11 .* is not finished"):
        folds.checkpoints_of([str(tmp_path)], best_in)


@pytest.mark.slow
def test_a_folds_ensemble_predicts_the_mean_of_its_models_outputs_the_same_on_one_and_two_processes(
    three_folds, project_root, tmp_path
):
    output, _ = three_folds
    model_task = seam.Task()
    inputs = output.parent / "data" / model_task.predict_sample
    written = {}
    for nproc in (1, 2):
        target = tmp_path / f"ensemble-{nproc}.csv"
        run_bash(project_root, "predict.sh", "--checkpoint", str(output), "--input", str(inputs), "--output",
                 str(target), nproc=nproc)  # fmt: skip
        written[nproc] = target.read_bytes()
    assert written[1] == written[2]

    # The same file from each fold's best model's outputs, averaged here: predict.py's batches, one process.
    one_process = argparse.Namespace(rank=0, world_size=1, on_gpu=False)
    total = 0
    for fold in range(3):
        model, description = inference.load_with_data(inference.checkpoint_path(output / f"fold-{fold}"), "cpu")
        dataset, keys = model_task.predict_set(inputs, description)
        batches = loaders.predict_loader(dataset, cli.parse_predict_args(["--input", "x"]).batch_size, 0, one_process)
        total = total + np.concatenate([inference.averaged_outputs(model, batch, model_task) for batch in batches])
    rows = model_task.rows_from_outputs(total / 3)
    mine = model_task.write_predictions(str(tmp_path / "mine.csv"), keys, rows, description, argparse.Namespace())
    assert Path(mine).read_bytes() == written[1]


@pytest.mark.slow
def test_a_fold_killed_part_way_resumes_and_the_folds_end_as_an_uninterrupted_run(three_folds, project_root, tmp_path):
    reference, _ = three_folds
    output = tmp_path / "output"
    args = ["--folds", "3", "--epochs", "2", "--device", "cpu", "--output-dir", str(output)]
    if settings.DATASET == "zip":
        args += ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NNODES")}
    env.update(NPROC_PER_NODE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    job = subprocess.Popen(["bash", "run.sh", *args], cwd=project_root, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    saved = output / "fold-1" / "checkpoints"
    deadline = time.monotonic() + 300
    while not inference.checkpoint_path(output / "fold-1", "last").exists():  # fold 0 done, fold 1 part-way
        assert job.poll() is None and time.monotonic() < deadline, f"the job ended before a save in {saved}"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # no warning: a lost machine, an out-of-memory kill
    job.wait()

    again = run_sh(project_root, output, "--folds", "3", "--epochs", "2")

    assert "fold 0 of 3 is finished" in again and "resumed from" in (output / "fold-1" / "train.log").read_text()
    for fold in range(3):
        assert without_timings(output / f"fold-{fold}") == without_timings(reference / f"fold-{fold}")
    assert json.loads((output / "cv.json").read_text()) == json.loads((reference / "cv.json").read_text())


def without_timings(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in record.items() if k not in ("epoch_time_s", "data_wait")} for record in records]
