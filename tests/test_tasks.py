"""Slow tier: every task other than the default, baked and trained with 2 processes, once per framework and
Paddle API (the launcher matrix stays on the default task). One job per task is shared by all its checks."""

import csv
import filecmp
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import TASK_CASES, answers_id, run
from PIL import Image
from test_training import read_metrics, train

pytestmark = pytest.mark.slow

# Each task's sample: its best metric and direction, the validation set's size, and what predict.py takes.
TASKS = {
    "regression": {"metric": "rmse", "mode": "min", "val": 89, "input": "data/diabetes/val.csv", "output": "p.csv"},
    "segmentation": {
        "metric": "miou", "mode": "max", "val": 360, "input": "data/digit_masks/val/images", "output": "masks",
        "csv": "masks.csv",
    },
    "text": {"metric": "auc", "mode": "max", "val": 205, "input": "data/docstrings/val.csv", "output": "p.csv"},
}  # fmt: skip
READ_BEST = {
    "pytorch": "import json, sys, torch; s = torch.load(sys.argv[1] + '/best.pt', weights_only=True); ",
    "paddle": "import json, sys, paddle; s = paddle.load(sys.argv[1] + '/best.pdopt'); ",
}


def best_checkpoint(project: Path, framework: str, output: Path) -> dict:
    """The best checkpoint's epoch and its best_* keys, read as a user would, in a fresh interpreter."""
    code = READ_BEST[framework] + (
        "print(json.dumps({key: s[key] for key in ('epoch', 'best_metric', 'best_mode', 'best_value')}))"
    )
    result = run(["python", "-c", code, str(output / "checkpoints")], project)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def best_epoch(metrics: list[dict], name: str, mode: str) -> dict:
    """The epoch metrics.jsonl says is best: the first of the best values in the task's direction."""
    pick = min if mode == "min" else max
    best = pick(record[f"val_{name}"] for record in metrics if math.isfinite(record[f"val_{name}"]))
    return next(record for record in metrics if record[f"val_{name}"] == best)


@pytest.fixture(
    scope="module",
    params=[pytest.param(case, id=answers_id(case), marks=pytest.mark.xdist_group(answers_id(case))) for case in TASK_CASES],
)  # fmt: skip
def task_job(request, cookies_session, tmp_path_factory):
    """A baked project of the task, trained 3 epochs on 2 processes into `output` (its checks share one test
    process: the xdist group of the case)."""
    answers = request.param
    result = cookies_session.bake(extra_context=answers)
    assert result.exit_code == 0, result.exception
    project, output = Path(result.project_path), tmp_path_factory.mktemp("task") / "out"
    trained = train(project, "--epochs", "3", "--output-dir", str(output))
    return answers, project, output, trained


def test_a_task_trains_on_its_sample_with_every_validation_sample_once_and_names_its_metric(task_job):
    answers, project, output, trained = task_job
    task = TASKS[answers["task"]]

    metrics = read_metrics(output)
    assert [record["epoch"] for record in metrics] == [1, 2, 3]
    assert all(record["val_samples"] == task["val"] and f"val_{task['metric']}" in record for record in metrics)
    name = f"val_{task['metric']}"
    best = best_epoch(metrics, task["metric"], task["mode"])
    done = [line for line in trained.stdout.splitlines() if "done: best" in line][-1]
    assert f"done: best {name} {best[name]:.4f}; checkpoint: " in done


def test_best_is_the_epoch_best_in_the_tasks_direction_and_a_resume_keeps_it(task_job):
    answers, project, output, _ = task_job
    task = TASKS[answers["task"]]
    saved = best_checkpoint(project, answers["framework"], output)

    best = best_epoch(read_metrics(output), task["metric"], task["mode"])
    assert (saved["best_metric"], saved["best_mode"]) == (task["metric"], task["mode"])
    assert saved["epoch"] == best["epoch"]
    assert saved["best_value"] == pytest.approx(best[f"val_{task['metric']}"], rel=1e-9)


def test_the_last_checkpoint_evaluated_by_1_or_3_processes_gives_the_metrics_of_its_2_process_epoch(task_job):
    answers, project, output, _ = task_job
    recorded = read_metrics(output)
    epoch_3 = recorded[2]

    for processes in (1, 3):
        result = run(["bash", "run.sh", "--evaluate", "--output-dir", str(output)], project,
                     NPROC_PER_NODE=str(processes))  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        evaluated = json.loads((output / "eval.json").read_text(encoding="utf-8"))
        assert f"eval: val_loss {evaluated['val_loss']:.4f}" in result.stdout
        assert "resumed from" not in result.stdout + result.stderr  # (nor a world size that changed: none trains)
        assert "world size changed" not in result.stdout + result.stderr
        assert evaluated["val_samples"] == epoch_3["val_samples"] == TASKS[answers["task"]]["val"]
        for name, value in evaluated.items():
            if name.startswith("val_"):
                assert value == pytest.approx(epoch_3[name], rel=1e-6, abs=1e-12), (processes, name)
    assert read_metrics(output) == recorded  # evaluating trained and logged nothing


def test_predictions_of_1_and_2_processes_are_the_same_bytes(task_job, tmp_path):
    """Segmentation's masks as a CSV too: a file (never a folder named .csv) that decodes to the PNG masks."""
    answers, project, output, _ = task_job
    task = TASKS[answers["task"]]
    best = output / "checkpoints" / ("best.pt" if answers["framework"] == "pytorch" else "best.pdparams")

    written = {}
    for processes in (1, 2):
        for name in filter(None, (task["output"], task.get("csv"))):
            target = tmp_path / str(processes) / name
            result = run(["bash", "predict.sh", "--checkpoint", str(best), "--input", task["input"], "--output",
                          str(target)], project, NPROC_PER_NODE=str(processes))  # fmt: skip
            assert result.returncode == 0, result.stderr[-3000:]
            written[processes, name] = target
    one, two = written[1, task["output"]], written[2, task["output"]]
    if one.is_dir():
        files = sorted(path.relative_to(one) for path in one.rglob("*") if path.is_file())
        assert len(files) == task["val"]
        assert filecmp.cmpfiles(one, two, files, shallow=False)[0] == files
    else:
        assert one.read_bytes() == two.read_bytes()
        assert len(one.read_text(encoding="utf-8").splitlines()) == task["val"] + 1
    if "csv" in task:
        table = written[1, task["csv"]]
        assert table.is_file() and table.read_bytes() == written[2, task["csv"]].read_bytes()
        assert table.read_text(encoding="utf-8").startswith("id,class,rle\n")
        masks = {path.relative_to(one).as_posix(): np.asarray(Image.open(path)) for path in one.rglob("*.png")}
        decoded = decoded_masks(table, {name: mask.shape for name, mask in masks.items()})
        assert decoded.keys() == masks.keys()
        assert all(np.array_equal(mask, masks[name]) for name, mask in decoded.items())


def decoded_masks(table: Path, shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    """The masks a CSV `id,class,rle` holds (pixels numbered from 1 down the columns), by the path of their PNG,
    each of the shape (height, width) that `shapes` gives that path."""
    flat: dict[str, np.ndarray] = {}
    with open(table, newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            name = Path(row["id"]).with_suffix(".png").as_posix()
            pixels = flat.setdefault(name, np.zeros(math.prod(shapes[name]), np.uint8))
            numbers = [int(number) for number in row["rle"].split()]
            for start, length in zip(numbers[::2], numbers[1::2], strict=True):
                pixels[start - 1 : start - 1 + length] = int(row["class"])
    return {name: pixels.reshape(shapes[name], order="F") for name, pixels in flat.items()}


def test_the_tasks_own_tests_pass_in_its_baked_project(task_job):
    """The task's part of the baked suite (the rest is the default task's, which test_training.py runs whole)."""
    answers, project, _, _ = task_job

    result = run(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/test_{answers['task']}.py"], project
    )

    assert result.returncode == 0, result.stdout[-5000:]
    assert " passed" in result.stdout.splitlines()[-1] and "failed" not in result.stdout.splitlines()[-1]


def test_a_resume_keeps_the_best_and_an_epoch_that_is_no_better_leaves_it_where_it_was(task_job):
    """Epoch 4 at learning rate 0: the weights stay, so it scores what epoch 3 scored (segmentation's batch norm
    statistics still move) and best.* stays at the best of epochs 1-3; for regression, a min metric, that is
    exactly a tie, and the best epoch is not the last."""
    answers, project, output, _ = task_job
    task = TASKS[answers["task"]]
    before = best_checkpoint(project, answers["framework"], output)

    train(project, "--epochs", "4", "--lr", "0", "--output-dir", str(output))

    metrics, name = read_metrics(output), f"val_{task['metric']}"
    assert [record["epoch"] for record in metrics] == [1, 2, 3, 4]
    after = best_checkpoint(project, answers["framework"], output)
    best = best_epoch(metrics, task["metric"], task["mode"])
    assert after["epoch"] == best["epoch"] and after["best_value"] == pytest.approx(best[name], rel=1e-9)
    if answers["task"] != "segmentation":
        assert metrics[3][name] == pytest.approx(metrics[2][name], rel=1e-9)
        assert after == before and after["epoch"] < 4
