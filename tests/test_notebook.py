"""Slow tier: the baked notebook run headless with a real kernel; launch() training in every other variant."""

import json
import os
from pathlib import Path

import nbformat
import pytest
from conftest import LAUNCH_CASES, RECOMMENDED_CASES, run
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

BEST = {"pytorch": "best.pt", "paddle": "best.pdparams"}
NOTEBOOK_CASES = [
    {"framework": "pytorch", "launcher": "spawn"},
    {"framework": "paddle", "launcher": "launch", "paddle_api": "basic"},
]
# launch() does not go through the launcher, but the launcher and API change how ranks join (fleet.init
# under fleetrun, paddle.Model under highlevel). The recommended projects run their whole suite in
# test_training.py, the cases above run the notebook: these are the rest.
OTHER_CASES = [answers for answers in LAUNCH_CASES if answers not in RECOMMENDED_CASES + NOTEBOOK_CASES]


def outputs(cell) -> list[dict]:
    return cell.get("outputs", [])


def text_of(cell) -> str:
    return "".join(output.get("text", "") for output in outputs(cell) if output["output_type"] == "stream")


def read_metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("answers", NOTEBOOK_CASES, ids=lambda a: "-".join(a.values()))
def test_the_notebook_runs_headless_trains_twice_plots_and_predicts(bake, answers):
    project = bake(**answers)
    notebook = nbformat.read(project / "notebook.ipynb", as_version=4)

    # As Jupyter starts it: ipykernel forwards what the ranks write to file descriptors 1 and 2 to the cell,
    # except under pytest (it checks PYTEST_CURRENT_TEST).
    kernel_env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    NotebookClient(
        notebook, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(project)}}
    ).execute(env=kernel_env)

    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    errors = [output for cell in cells for output in outputs(cell) if output["output_type"] == "error"]
    assert not errors, errors
    [run_folder] = (project / "output" / "notebook").iterdir()
    # One process in the kernel: its log lines in its cell.
    [in_kernel] = [cell for cell in cells if "train_here" in cell.source]
    assert "1 process(es)" in text_of(in_kernel) and "epoch 1/1" in text_of(in_kernel)
    widgets = [o for o in outputs(in_kernel) if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, "no progress bar widget in the in-kernel run's cell"
    [record] = read_metrics(run_folder / "debug")
    assert record["world_size"] == 1
    # Two processes started from the kernel: rank 0's log lines in the cell, rank 1's in its file.
    [launched] = [cell for cell in cells if "notebook.launch(" in cell.source]
    assert "2 process(es)" in text_of(launched) and "epoch 3/3" in text_of(launched)
    two = run_folder / "two-processes"
    metrics = read_metrics(two)
    assert [m["epoch"] for m in metrics] == [1, 2, 3] and {m["world_size"] for m in metrics} == {2}
    assert (two / "checkpoints" / BEST[answers["framework"]]).is_file()
    assert [p.name for p in (two / "logs").iterdir()] == ["rank1.log"]
    # The metrics plot, and predict.py's job on the validation images, in this kernel.
    pictures = [cell for cell in cells if any("image/png" in o.get("data", {}) for o in outputs(cell))]
    assert len(pictures) == 1 and 'f"val_{task.best_metric}"' in pictures[0].source
    [predicted] = [cell for cell in cells if "predict.predict(" in cell.source]
    assert "predicted 360 inputs" in text_of(predicted)
    rows = (run_folder / "two-processes" / "predictions").read_text(encoding="utf-8").splitlines()
    assert rows[0] == "image,label" and len(rows) == 361


def test_in_a_kernel_without_ipywidgets_the_training_cell_trains_with_a_text_bar(bake):
    project = bake(framework="pytorch", launcher="spawn")
    notebook = nbformat.read(project / "notebook.ipynb", as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    in_kernel = next(index for index, cell in enumerate(cells) if "train_here" in cell.source)
    # As in AI Studio's kernel or a plain Jupyter: `import ipywidgets` fails.
    no_widgets = nbformat.v4.new_code_cell("import sys\n\nsys.modules['ipywidgets'] = None")
    notebook.cells = [no_widgets, *cells[: in_kernel + 1]]

    kernel_env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    NotebookClient(
        notebook, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(project)}}
    ).execute(env=kernel_env)

    training = notebook.cells[-1]
    assert [output for output in outputs(training) if output["output_type"] == "error"] == []
    assert "epoch 1/1" in text_of(training)
    assert not [o for o in outputs(training) if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    bar = "".join(o.get("text", "") for o in outputs(training) if o.get("name") == "stderr")
    assert "epoch 1:" in bar and "it/s]" in bar


def test_in_a_kernel_a_bad_argument_or_a_rank_that_fails_shows_one_error_line_not_a_traceback(bake):
    project = bake(framework="pytorch", launcher="spawn")
    mistakes = [
        'notebook.train_here(["--epochs", "0"])',
        'notebook.launch(["--no-synthetic", "--data-dir", "missing", "--device", "cpu"], nproc=2)',
    ]
    cells = ["from dist_train import notebook", *mistakes]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    kernel_env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    NotebookClient(
        notebook, kernel_name="python3", timeout=300, allow_errors=True, resources={"metadata": {"path": str(project)}}
    ).execute(env=kernel_env)

    shown = [[o["traceback"] for o in outputs(cell) if o["output_type"] == "error"] for cell in notebook.cells[1:]]
    assert shown[0] == [["error: argument --epochs: must be at least 1, got 0 (run.py --help lists the flags)"]]
    [[line]] = shown[1]
    assert line.startswith("error: ") and "missing" in line, line


@pytest.mark.parametrize("answers", OTHER_CASES, ids=lambda a: "-".join(a.values()))
def test_launch_trains_run_py_on_two_ranks_in_every_other_variant(bake, answers):
    project = bake(**answers)

    result = run(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_notebook.py", "-k", "run_py_training"],
        project,
        timeout=600,
    )

    assert result.returncode == 0, result.stdout[-5000:]
    assert "2 passed" in result.stdout
