"""notebook.launch() and notebook.train_here(): training started from a running interpreter, as from a Jupyter kernel.

A "notebook function" here is source exec'd in a namespace named __main__, as a cell's
function is: no module holds it, so a spawned process could not unpickle it.
"""

import fcntl
import json
import logging
import multiprocessing.context
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import copy_of_project

from {{ cookiecutter.project_slug }} import cli, inference, loaders, notebook, output_folder, settings, task, workspace
from {{ cookiecutter.project_slug }}.data import PREDICT_SAMPLE, build_datasets, build_predict_set
from {{ cookiecutter.project_slug }}.errors import UserError

pytestmark = pytest.mark.slow

CELL = """
import os
import signal
import sys
import time
from pathlib import Path

from {{ cookiecutter.project_slug }} import distributed


def report_rank(args):
    env = distributed.setup("cpu", 60)
    try:
        total = distributed.all_reduce_sum([1.0], env)
        line = f"{env.rank} {env.world_size} {total[0]:g} {os.getpid()}"
        Path(args.output_dir, f"rank{env.rank}.txt").write_text(line)
    finally:
        distributed.cleanup()


def fail_on_rank_1(args):
    if distributed.read_ranks()[0] == 1:
        raise ValueError("rank 1 cannot go on")
    time.sleep(120)  # rank 0 would wait long: launch() must stop it


def exit_stopped(args):
    sys.exit(143)


def metrics_of_no_sums(args):
    from {{ cookiecutter.project_slug }} import task

    task.metrics({}, {}, 1)  # (a KeyError, raised in task.py)


def wait_for_the_stop(args):
    rank = distributed.read_ranks()[0]
    folder = Path(args.output_dir)

    def save_and_leave(signum, frame):
        (folder / f"saved{rank}").write_text("")
        sys.exit(143)

    signal.signal(signal.SIGTERM, save_and_leave)
    (folder / f"pid{rank}").write_text(str(os.getpid()))
    time.sleep(120)
"""


def notebook_function(name: str):
    namespace = {"__name__": "__main__"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)
    return namespace[name]


def children() -> set[int]:
    """This process's child processes (Linux)."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    return {int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split()}


def alive(pid: int) -> bool:
    """Running, not a zombie (the state follows the name in parentheses); a process reaped meanwhile is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    """Arguments that read the project's data from a folder of this module's own (extracted there once)."""
    if settings.DATASET != "zip":
        return []
    data_dir = tmp_path_factory.mktemp("data") / settings.SAMPLE
    return ["--dataset-zip", str(workspace.SAMPLE_ARCHIVE), "--data-dir", str(data_dir)]


def cpu_args(output_dir: Path) -> list[str]:
    """On CPUs: any machine can start two ranks (one GPU cannot take both), and this process never starts CUDA."""
    return ["--output-dir", str(output_dir), "--device", "cpu"]


def training_args(output_dir: Path, data_args: list[str], epochs: int = 1) -> list[str]:
    return ["--epochs", str(epochs), "--output-dir", str(output_dir), "--device", "cpu", *data_args]


def read_metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_function_defined_in_a_notebook_runs_on_two_ranks_that_know_their_rank(tmp_path):
    report_rank = notebook_function("report_rank")
    assert not notebook.importable(report_rank)  # as a cell's function: spawn could not start it
    before = children()

    notebook.launch(cpu_args(tmp_path), nproc=2, train=report_rank)

    lines = [(tmp_path / f"rank{rank}.txt").read_text().split() for rank in (0, 1)]
    assert [line[:3] for line in lines] == [["0", "2", "2"], ["1", "2", "2"]]
    assert len({line[3] for line in lines} | {str(os.getpid())}) == 3  # two processes, neither this one
    assert children() == before


def test_launch_can_be_called_again_in_the_same_process(tmp_path):
    report_rank = notebook_function("report_rank")
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
        notebook.launch(cpu_args(tmp_path / run), nproc=2, train=report_rank)
    assert sorted(p.name for p in (tmp_path / "second").iterdir()) == ["rank0.txt", "rank1.txt"]


def test_a_failing_rank_raises_one_exception_with_its_error_and_the_others_are_stopped(tmp_path):
    before = children()
    started = time.monotonic()

    with pytest.raises(notebook.RankFailed) as failure:
        notebook.launch(cpu_args(tmp_path), nproc=2, train=notebook_function("fail_on_rank_1"))

    assert str(failure.value) == "ValueError: rank 1 cannot go on"
    assert failure.value.rank == 1
    assert "fail_on_rank_1" in str(failure.value.__cause__)  # the failing rank's traceback, and only its
    shown = failure.value._render_traceback_()  # what a notebook shows of it: that traceback
    assert shown[0] == "rank 1:" and shown[-1] == "ValueError: rank 1 cannot go on", shown
    assert time.monotonic() - started < 30  # rank 0 did not sleep its 120 s
    assert children() == before


def test_a_user_error_in_the_ranks_comes_back_as_its_one_line(tmp_path):
    missing = tmp_path / "missing"
    data_args = ["--no-synthetic", "--data-dir", str(missing)]
    with pytest.raises(UserError) as in_this_process:  # the line data.py's datasets give for a missing folder
        build_datasets(cli.parse_args(data_args))

    with pytest.raises(notebook.RankFailed) as failure:
        notebook.launch([*data_args, *cpu_args(tmp_path)], nproc=2)

    assert str(failure.value) == str(in_this_process.value) and str(missing) in str(failure.value)
    assert "\n" not in str(failure.value)
    assert failure.value.__cause__ is None
    assert failure.value._render_traceback_() == [f"error: {failure.value}"]  # a notebook shows its one line


def test_a_rank_that_stops_with_status_143_is_reported_as_stopped(tmp_path):
    with pytest.raises(notebook.RankFailed, match="stopped by SIGTERM"):
        notebook.launch(cpu_args(tmp_path), nproc=2, train=notebook_function("exit_stopped"))


def test_bad_arguments_are_a_user_error_before_any_process_starts():
    before = children()
    with pytest.raises(UserError, match="argument --epochs: must be at least 1, got 0"):
        notebook.launch(["--epochs", "0"], nproc=2)
    assert children() == before


def test_a_notebook_function_is_refused_in_one_line_where_fork_cannot_work(monkeypatch, tmp_path):
    monkeypatch.setattr(notebook, "fork_blocker", lambda: "CUDA is initialised in this kernel")

    with pytest.raises(UserError) as refusal:
        notebook.launch(cpu_args(tmp_path), nproc=2, train=notebook_function("report_rank"))

    message = str(refusal.value)
    assert "\n" not in message
    assert "CUDA is initialised in this kernel" in message
    assert "Move report_rank() into a .py file" in message


def test_launch_on_a_folder_that_a_running_job_holds_stops_in_one_line_and_writes_nothing(
    tmp_path, data_args, monkeypatch
):
    output = tmp_path / "output"
    output.mkdir()
    monkeypatch.setenv(output_folder.WAIT_VARIABLE, "1")  # (a job that is stopping: waited for 1 s; this one is not)
    with open(output / output_folder.LOCK_NAME, "w") as held:  # as run.sh's rank 0 holds the folder it trains in
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("host gpu-7, process 4242")
        held.flush()

        with pytest.raises(notebook.RankFailed) as refusal:
            notebook.launch(training_args(output, data_args), nproc=2)

    assert str(refusal.value).startswith(f"output folder {output} is in use by another job (host gpu-7, process 4242)")
    assert "\n" not in str(refusal.value)
    assert [path.name for path in output.iterdir()] == [output_folder.LOCK_NAME]


def test_run_py_training_starts_with_spawn_where_fork_cannot_work(monkeypatch, tmp_path, data_args):
    monkeypatch.setattr(notebook, "fork_blocker", lambda: "CUDA is initialised in this kernel")

    notebook.launch(training_args(tmp_path, data_args), nproc=2)

    [record] = read_metrics(tmp_path)
    assert record["world_size"] == 2


def test_run_py_training_on_two_ranks_writes_what_run_sh_would_and_shows_rank_0s_log(tmp_path, data_args, capfd):
    before = children()

    notebook.launch(training_args(tmp_path, data_args), nproc=2)

    [record] = read_metrics(tmp_path)
    assert record["world_size"] == 2
    assert record["val_samples"] == len(build_datasets(cli.parse_args(data_args))[1])
    out = capfd.readouterr().out
    assert "2 process(es)" in out and "epoch 1/1" in out  # rank 0's log lines, on this process's output
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["rank1.log"]
    assert children() == before


@pytest.fixture(scope="module")
def trained_here(tmp_path_factory, data_args) -> dict:
    """One train_here() run of 2 epochs, and this process's state around it."""
    output_dir = tmp_path_factory.mktemp("here") / "output"
    handler, before = signal.getsignal(signal.SIGTERM), children()
    notebook.train_here(training_args(output_dir, data_args, epochs=2))
    return {
        "output_dir": output_dir,
        "sigterm_handler_kept": signal.getsignal(signal.SIGTERM) is handler,
        "children_kept": children() == before,
        "log_handlers": list(logging.getLogger(notebook.__package__).handlers),
    }


def test_train_here_trains_in_this_process_and_leaves_it_as_it_was(trained_here):
    metrics = read_metrics(trained_here["output_dir"])
    assert [record["world_size"] for record in metrics] == [1, 1]
    assert trained_here["sigterm_handler_kept"]
    assert trained_here["log_handlers"] == []  # train.log is closed
    assert trained_here["children_kept"]


def test_train_here_raises_a_user_error_instead_of_exiting(tmp_path):
    with pytest.raises(UserError, match="not found"):
        notebook.train_here(["--no-synthetic", "--data-dir", str(tmp_path / "missing"), *cpu_args(tmp_path)])


def test_a_mistake_in_the_users_files_comes_back_as_their_frames_and_one_line_from_this_process_and_the_ranks(
    tmp_path,
):
    with pytest.raises(UserError) as here:
        notebook.train_here(cpu_args(tmp_path / "here"), train=notebook_function("metrics_of_no_sums"))
    with pytest.raises(notebook.RankFailed) as ranks:
        notebook.launch(cpu_args(tmp_path / "ranks"), nproc=2, train=notebook_function("metrics_of_no_sums"))

    for error in (here.value, ranks.value):
        *frames, line = shown = error._render_traceback_()  # what a notebook shows of it, as IPython asks
        assert line.startswith("error: metrics() in task.py raised KeyError: "), shown
        assert frames[0].strip().startswith("File ") and "task.py" in frames[0], shown
        assert all("notebook" not in frame and "training.py" not in frame for frame in frames), shown


CHANGED_TASK = """
import time
from pathlib import Path

from {{ cookiecutter.project_slug }} import seam

task_py = Path("{{ cookiecutter.project_slug }}/task.py")
first = task_py.read_text(encoding="utf-8")
print("first", seam.Task().best_metric)
for added in ("BEST_METRIC = 'changed'", "LOSS = nn.MSELoss()", ""):  # a new value, a mistake, then none
    time.sleep(0.1)  # (an edit a moment later: another modification time)
    task_py.write_text(first + "\\n" + added + "\\n", encoding="utf-8")
    try:
        print("then", seam.Task().best_metric)
    except NameError as error:
        print("then", error)
"""


def test_a_change_to_task_py_after_the_kernel_imported_it_is_what_the_next_task_reads(project_root, tmp_path):
    project = copy_of_project(project_root, tmp_path / "project")

    result = subprocess.run([sys.executable, "-c", CHANGED_TASK], cwd=project, capture_output=True, text=True)

    assert result.returncode == 0, result.stderr[-3000:]
    first, again = f"first {task.BEST_METRIC}", f"then {task.BEST_METRIC}"
    assert result.stdout.splitlines() == [first, "then changed", "then name 'nn' is not defined", again]


def test_the_best_checkpoint_predicts_one_row_for_each_input_of_a_batch(trained_here, data_args):
    args = cli.parse_args(data_args)
    model, description = inference.load_with_data(
        inference.checkpoint_path(trained_here["output_dir"], "best"), device="cpu"
    )
    inputs, keys = build_predict_set(Path(args.data_dir) / PREDICT_SAMPLE, description)
    one_process = SimpleNamespace(rank=0, world_size=1, on_gpu=False)
    batch = next(iter(loaders.predict_loader(inputs, 20, 0, one_process)))

    rows = inference.predict(model, batch)

    assert isinstance(rows, list) and len(rows) == min(20, len(keys))


def test_a_missing_checkpoint_is_one_line_naming_it(tmp_path):
    with pytest.raises(UserError, match="not found"):
        inference.load_for_inference(tmp_path / "best.pt", device="cpu")


def test_each_notebook_run_gets_a_fresh_output_folder(tmp_path):
    first, second = notebook.fresh_output_dir(tmp_path), notebook.fresh_output_dir(tmp_path)
    assert first != second
    assert first.is_dir() and second.is_dir() and not any(second.iterdir())


STOP_SCRIPT = """
import signal
import sys
# As a Jupyter kernel does: a process started in the background by a shell inherits SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, sys.argv[2])
from {{ cookiecutter.project_slug }} import notebook
namespace = {"__name__": "__main__"}
exec(compile(sys.argv[3], "<notebook cell>", "exec"), namespace)
try:
    notebook.launch(["--output-dir", sys.argv[1], "--device", "cpu"], nproc=2, train=namespace["wait_for_the_stop"])
except KeyboardInterrupt:
    print("interrupted")
"""


def test_the_stop_button_stops_every_rank_with_sigterm_and_leaves_no_process(tmp_path, project_root):
    kernel = subprocess.Popen(
        [sys.executable, "-c", STOP_SCRIPT, str(tmp_path), str(project_root), CELL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid_files = [tmp_path / "pid0", tmp_path / "pid1"]
    deadline = time.monotonic() + 60
    while not all(path.exists() and path.read_text() for path in pid_files):
        assert kernel.poll() is None and time.monotonic() < deadline, kernel.communicate()
        time.sleep(0.1)
    ranks = [int(path.read_text()) for path in pid_files]

    kernel.send_signal(signal.SIGINT)  # what Jupyter's stop button sends the kernel
    out, err = kernel.communicate(timeout=60)

    assert "interrupted" in out, err
    assert (tmp_path / "saved0").exists() and (tmp_path / "saved1").exists(), err  # each rank had its SIGTERM
    assert not any(alive(pid) for pid in ranks), err


def test_the_stop_button_pressed_while_ranks_are_starting_leaves_no_process(tmp_path, monkeypatch):
    start = multiprocessing.context.ForkProcess.start

    def start_then_press_stop(process):  # the press lands just after the last rank is forked
        start(process)
        if process.name == "rank1":
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", start_then_press_stop)
    before = children()

    kernels_handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in the stop-button test
    try:
        with pytest.raises(KeyboardInterrupt):
            notebook.launch(cpu_args(tmp_path), nproc=2, train=notebook_function("wait_for_the_stop"))
    finally:
        signal.signal(signal.SIGINT, kernels_handler)

    assert children() == before
