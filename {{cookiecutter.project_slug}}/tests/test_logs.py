"""metrics.jsonl stays one line per finished epoch across crashes and resumes; train.log keeps why a run ended."""

import json
import logging
import sys

import pytest

from {{ cookiecutter.project_slug }} import errors, logs, settings


def write_epochs(path, epochs):
    for epoch in epochs:
        logs.append_metrics(path, {"epoch": epoch, "train_loss": 1.0 / epoch})


def test_resuming_forgets_epochs_the_checkpoint_does_not_cover(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_epochs(path, [1, 2, 3])

    logs.drop_metrics_after(path, 2)

    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2]


def test_a_line_torn_by_a_crash_is_dropped_instead_of_blocking_the_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_epochs(path, [1, 2])
    with open(path, "a") as file:
        file.write('{"epoch": 3, "train_lo')

    logs.drop_metrics_after(path, 2)
    write_epochs(path, [3])

    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_each_log_starts_with_the_template_version_and_the_console_says_it_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(logs, "_VERSION_ON_CONSOLE", False)  # a new process
    for folder in ("run", "run/fold-0", "run/fold-1"):  # a run of --folds sets up each fold's log in turn
        logs.setup_logging(tmp_path / folder, 0)
    for handler in logs.PACKAGE_LOGGER.handlers:
        handler.close()

    version = f"dist-template {settings.TEMPLATE_VERSION}"
    assert capsys.readouterr().out.count(version) == 1
    for folder in ("run", "run/fold-0", "run/fold-1"):
        assert (tmp_path / folder / "train.log").read_text().splitlines()[0].endswith(version)


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is no JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_metric_that_is_not_a_number_is_null_in_metrics_jsonl_and_eval_json_which_stay_strict_json(tmp_path):
    val_stats = {"loss": 0.5, "auc": float("nan"), "acc": float("inf"), "samples": 8}  # a validation set of one class
    logs.MetricsLog(tmp_path / "metrics.jsonl", True, 1, 0).report(
        1, {"loss": 0.7, "samples": 32, "data_wait": 0.0, "lr": 0.1}, val_stats, 0.0
    )
    logs.report_evaluation(tmp_path, val_stats, True, "best.pt")

    [row] = [strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluation = strict_json((tmp_path / "eval.json").read_text())
    assert row["val_loss"] == 0.5 and row["val_auc"] is None and row["val_acc"] is None
    assert evaluation["val_auc"] is None and evaluation["val_samples"] == 8


def test_the_error_line_that_ends_a_run_is_in_its_train_log_too_not_only_on_the_console(tmp_path, capsys):
    logs.setup_logging(tmp_path, rank=0)

    @errors.explain_user_errors
    def train(args):
        raise errors.UserError("--data-dir nowhere not found: pass the folder of the data")

    try:
        with pytest.raises(SystemExit):
            train(None)
    finally:
        logs.PACKAGE_LOGGER.handlers.clear()

    assert capsys.readouterr().err == "error: --data-dir nowhere not found: pass the folder of the data\n"
    last = (tmp_path / "train.log").read_text().splitlines()[-1]
    assert last.endswith(" error: --data-dir nowhere not found: pass the folder of the data")


def test_ctrl_c_during_a_save_whose_writer_then_fails_is_the_interrupted_line_not_a_traceback(capsys):
    @errors.explain_user_errors
    def train(args):
        try:
            raise KeyboardInterrupt  # heard inside torch.save()
        finally:
            raise RuntimeError("unexpected pos 64 vs 0")  # its zip writer's cleanup, cut short

    with pytest.raises(SystemExit) as ended:
        train(None)

    assert ended.value.code == errors.INTERRUPTED_STATUS
    assert capsys.readouterr().err.startswith("error: interrupted (Ctrl-C): the checkpoints saved so far are kept")


def test_a_fresh_run_in_a_folder_of_an_earlier_run_says_that_its_metrics_and_saves_are_replaced(tmp_path, caplog):
    logs.append_metrics(tmp_path / "metrics.jsonl", {"epoch": 1, "val_loss": 0.5})

    metrics = logs.MetricsLog(tmp_path / "metrics.jsonl", True, 3, 0)  # --resume none

    assert f"this run starts afresh in {tmp_path}: the earlier run's metrics and saves" in caplog.text
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1  # until its first epoch: it may fail first
    metrics.report(1, {"loss": 0.7, "samples": 32, "data_wait": 0.0, "lr": 0.1}, {"loss": 0.25, "samples": 8}, 0.0)
    assert [json.loads(line)["val_loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0.25]
    caplog.clear()
    logs.append_metrics(tmp_path / "metrics.jsonl", {"epoch": 1, "val_loss": 0.5})
    logs.MetricsLog(tmp_path / "metrics.jsonl", True, 3, 1)  # a resumed run
    assert "afresh" not in caplog.text


def test_a_log_handler_made_while_the_framework_is_imported_writes_to_stderr_afterwards(capsys):
    logger = logging.getLogger("imported_with_its_own_handler")
    with errors.ended_quietly_by_ctrl_c():  # as run.py and predict.py import the framework
        logger.addHandler(logging.StreamHandler(sys.stderr))  # as torch does under TORCH_LOGS
    try:
        logger.warning("a recompilation, say")
    finally:
        logger.handlers.clear()

    assert "a recompilation, say" in capsys.readouterr().err
