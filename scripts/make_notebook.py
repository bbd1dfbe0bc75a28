"""Write the template's notebook, {{cookiecutter.project_slug}}/notebook.ipynb, from the cells below.

python scripts/make_notebook.py   (after editing a cell here; the test suite bakes and runs the result)

Cookiecutter renders the notebook as a Jinja template: code cells hold Jinja only in the
package name of their imports, markdown cells also in single-quoted expressions (a double
quote would end the JSON string it sits in).
"""

from pathlib import Path

import nbformat

PACKAGE = "{{ cookiecutter.project_slug }}"
TRACKER = "{{ 'TensorBoard' if cookiecutter.framework == 'pytorch' else 'VisualDL' }}"
TRACKER_COMMAND = "{{ 'tensorboard' if cookiecutter.framework == 'pytorch' else 'visualdl' }}"
NOTEBOOK = Path(__file__).resolve().parent.parent / "{{cookiecutter.project_slug}}" / "notebook.ipynb"

CELLS = [
    (
        "markdown",
        f"""# Training `{PACKAGE}` from a notebook

This notebook trains the project's model as you will while developing it: first one process inside
this kernel (a quick debug), then 2 processes started from the kernel. Then it plots the metrics and
lets the best checkpoint predict the sample's validation inputs, as predict.py does.

It runs top to bottom on a CPU in well under a minute. It needs `pip install -r requirements-notebook.txt`;
headless: `jupyter nbconvert --to notebook --execute notebook.ipynb`. Each run of the notebook writes into a
new folder under `output/notebook/`, so running it again trains again.""",
    ),
    (
        "code",
        f"""import json
from pathlib import Path

import matplotlib.pyplot as plt

import predict
from {PACKAGE} import cli, inference, notebook, seam

task = seam.Task()  # model.py, data.py and task.py: what this project learns

runs = notebook.fresh_output_dir()  # output/notebook/<date>-<time>/, new each time
print("this run writes to", runs)""",
    ),
    (
        "markdown",
        """## 1. One process, in this kernel

`notebook.train_here(args)` runs run.py's training in this process, as `python run.py ARGS` does: the
quickest way to try a change to `model.py` or `data.py`, and to debug it. A wrong argument or missing
data stops it with one error line.""",
    ),
    (
        "code",
        """notebook.train_here(["--epochs", "1", "--output-dir", str(runs / "debug")])""",
    ),
    (
        "markdown",
        f"""## 2. Two processes, started from this kernel

`notebook.launch(args, nproc=2)` starts 2 processes from this kernel, gives each the variables a launcher
sets (its rank, the number of processes, where they meet), runs run.py's training in each, and returns
when both have ended. They train as `bash run.sh` does: rank 0 writes the metrics and checkpoints and its
log lines show below; rank 1 logs to `logs/rank1.log`.

- A rank that fails raises one exception here, with that rank's error as its message.
- The stop button stops every rank. They save a checkpoint first: the same call, with the same
  `--output-dir`, continues from it.
- A function of your own runs the same way on every rank, even one defined in a cell:

```python
from {PACKAGE} import distributed

def hello(args):
    env = distributed.setup("cpu")
    try:
        total = distributed.all_reduce_sum([env.rank], env)
        print(f"rank {{env.rank}} of {{env.world_size}}: the ranks add up to {{total[0]:g}}")
    finally:
        distributed.cleanup()

notebook.launch([], nproc=2, train=hello)
```

The processes are forked from this kernel: that is how a function from a cell reaches them. Once the
kernel has used a GPU, a forked process cannot: run.py's training (and a function imported from a `.py`
file) then starts in fresh processes instead, and a function from a cell is refused with one line that
says what to do.""",
    ),
    (
        "code",
        """run_dir = runs / "two-processes"
notebook.launch(["--epochs", "3", "--output-dir", str(run_dir)], nproc=2)""",
    ),
    (
        "markdown",
        f"""## 3. The metrics

Rank 0 appends one JSON line per epoch to `metrics.jsonl`: the losses, the validation metrics of
`task.py` (`val_<name>`; `task.BEST_METRIC` picks the best checkpoint), the number of processes, the
samples seen. {TRACKER} shows the same numbers, and the training loss as it
goes down: `{TRACKER_COMMAND} --logdir output/notebook` (`--no-tracking` turns that off).""",
    ),
    (
        "code",
        """records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
epochs = [record["epoch"] for record in records]

metric = f"val_{task.best_metric}"

fig, (loss_plot, metric_plot) = plt.subplots(1, 2, figsize=(10, 3.5))
loss_plot.plot(epochs, [record["train_loss"] for record in records], "o-", label="training")
loss_plot.plot(epochs, [record["val_loss"] for record in records], "o-", label="validation")
loss_plot.set(title="loss", xlabel="epoch", xticks=epochs)
loss_plot.legend()
metric_plot.plot(epochs, [record[metric] for record in records], "o-")
metric_plot.set(title=f"{metric} ({task.best_mode} is best)", xlabel="epoch", xticks=epochs)
plt.show()""",
    ),
    (
        "markdown",
        """## 4. The best checkpoint, predicting

predict.py's job runs here in this process: the checkpoint of the epoch with the best validation metric
predicts the sample's validation inputs (`PREDICT_SAMPLE` in `data.py`), and `task.write_predictions()`
writes them in the task's submission form. In your own code, `inference.load_for_inference()` gives the
model and `inference.predict(model, batch)` the rows of `task.predict_step()`.""",
    ),
    (
        "code",
        """args = cli.parse_args(["--output-dir", str(run_dir)])
best, predictions = inference.checkpoint_path(run_dir, "best"), run_dir / "predictions"
sample = Path(args.data_dir) / task.predict_sample
argv = ["--checkpoint", str(best), "--input", str(sample), "--output", str(predictions)]
predict.predict(cli.parse_predict_args(argv))
written = sorted(predictions.rglob("*")) if predictions.is_dir() else predictions.read_text().splitlines()
print(*written[:6], sep="\\n")""",
    ),
    (
        "markdown",
        """## Next

Change `model.py` (`build_model`), `data.py` (`build_datasets`) or `task.py` (the loss, the metrics, the
predictions) and run the notebook again. For the real
run, on all the GPUs of a machine or on several machines, use `bash run.sh` (see README.md).""",
    ),
]


def build() -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for index, (kind, source) in enumerate(CELLS):
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        notebook.cells.append(make(source, id=f"cell-{index}"))
    nbformat.validate(notebook)
    return notebook


if __name__ == "__main__":
    nbformat.write(build(), NOTEBOOK)
    print(f"wrote {NOTEBOOK}")
