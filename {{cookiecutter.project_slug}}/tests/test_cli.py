"""Flags: where the data comes from, and defaults that do not depend on the working folder."""

import inspect
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from {{ cookiecutter.project_slug }} import cli, options, settings, workspace
from {{ cookiecutter.project_slug }}.errors import PlatformError

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "SLURM_NTASKS")


def test_an_explicit_data_dir_alone_means_the_data_is_already_there(tmp_path):
    args = cli.parse_args(["--data-dir", str(tmp_path / "mine")])

    assert args.data_dir == str(tmp_path / "mine")
    assert args.dataset_zip is None


def test_an_explicit_archive_alone_is_extracted_beside_itself(tmp_path):
    for name, folder in (
        ("cats.zip", "cats"),
        ("cats.tar.gz", "cats"),
        ("cats.tgz", "cats"),
        ("cats.bin", "cats.bin.data"),
    ):
        args = cli.parse_args(["--dataset-zip", str(tmp_path / name)])
        assert Path(args.data_dir) == tmp_path / folder


def test_without_data_flags_the_project_uses_its_sample_data_and_names_no_archive_to_extract_first():
    args = cli.parse_args([])

    assert Path(args.data_dir) == workspace.SAMPLE_DATA_DIR
    assert args.dataset_zip is None  # the sample datasets extract data/digits.zip when they read it
    assert args.synthetic == (settings.DATASET == "synthetic")


def test_default_paths_do_not_depend_on_the_working_folder(tmp_path, monkeypatch):
    here = cli.parse_args([])
    monkeypatch.chdir(tmp_path)
    elsewhere = cli.parse_args([])

    assert Path(elsewhere.output_dir).is_absolute()
    assert (elsewhere.output_dir, elsewhere.data_dir) == (here.output_dir, here.data_dir)
    assert Path(elsewhere.data_dir).parent.parent == Path(os.path.dirname(cli.__file__)).parent


@pytest.mark.parametrize(
    "flag, value, must",
    [
        ("--workers", "-1", "must be 0 or more, got -1"),
        ("--epochs", "0", "must be at least 1, got 0"),
        ("--batch-size", "0", "must be at least 1, got 0"),
        ("--grad-accum", "0", "must be at least 1, got 0"),
        ("--dist-timeout", "-1", "must be a number of seconds above 0, got -1"),
        ("--extract-timeout", "nan", "must be a number of seconds above 0, got nan"),
        ("--ema", "1", "must be at least 0 and below 1, got 1"),
        ("--lr", "-1", "must be a number, 0 or more, got -1"),
        ("--epochs", "one", "must be a whole number, at least 1, got one"),  # (not argparse's words for the type)
        ("--lr", "abc", "must be a number, 0 or more, got abc"),
    ],
)
def test_impossible_numbers_are_refused_before_anything_starts(flag, value, must, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.parse_args([flag, value])

    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: argument {flag}: {must} (run.py --help lists the flags)"]


def test_a_group_column_without_folds_is_one_line_rather_than_ignored(capsys):
    declared = "--group-column" in cli.build_parser().format_help()  # a task option: not every data.py has it

    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["--group-column", "site"])

    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and "--group-column" in line
    assert ("it needs --folds K" in line) == declared


@pytest.mark.parametrize("name, says", [("nope.csv", "no file"), (".", "is a folder: name the file")])
def test_an_option_of_type_file_that_is_no_file_is_one_line_before_anything_is_predicted(
    tmp_path, capsys, monkeypatch, name, says
):
    reference = {"type": "file"}  # (what a task.py may declare for predict.py)
    monkeypatch.setattr(options, "declared_in", lambda file, _: {"--reference": reference} if file == "task.py" else {})

    with pytest.raises(SystemExit) as stop:
        cli.parse_predict_args(["--input", str(tmp_path), "--reference", str(tmp_path / name)])

    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: argument --reference: ") and says in line


def test_an_option_declared_with_code_rather_than_plain_values_is_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / "data.py").write_text('OPTIONS = {\n    "--max-length": {"type": int, "default": 128},\n}\n')
    monkeypatch.setattr(options, "__file__", str(tmp_path / "options.py"))  # (the package's data.py beside it)

    with pytest.raises(PlatformError, match=r"^data.py: OPTIONS\['--max-length'\] must hold plain values.*\"int\""):
        options.declared_in("data.py", "OPTIONS")


def test_a_flag_run_py_does_not_know_is_one_line_naming_it_and_the_nearest_through_run_sh_too(project_root, tmp_path):
    result = subprocess.run(
        ["bash", "run.sh", "--learning-rate", "0.1", "--output-dir", str(tmp_path / "out")],
        cwd=project_root, env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert result.returncode == 2
    assert (result.stdout + result.stderr).splitlines() == [
        "error: unrecognized arguments: --learning-rate 0.1 (the nearest: --lr) (run.py --help lists the flags)"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "script, flag, python_script, one_of_its_flags",
    [("run.sh", "--help", "run.py", "--epochs"), ("predict.sh", "-h", "predict.py", "--checkpoint")],
)
def test_help_through_the_shell_scripts_is_the_python_scripts_help(
    project_root, script, flag, python_script, one_of_its_flags
):
    result = subprocess.run(
        ["bash", script, flag], cwd=project_root,
        env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith(f"usage: {python_script} [-h]") and one_of_its_flags in result.stdout


@pytest.mark.parametrize(
    "flag, nearest",
    [
        ("--num_workers=2", "--workers"),
        ("--max-epochs", "--epochs"),
        ("--batch-sise", "--batch-size"),
        ("--epoch", "--epochs"),  # a flag's beginning is no abbreviation of it
        ("--zzz", None),
    ],
)
def test_an_unknown_flag_names_the_nearest_by_spelling_or_by_what_other_trainers_call_it(capsys, flag, nearest):
    with pytest.raises(SystemExit) as stop:
        cli.parse_args([flag, "3"])

    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: unrecognized arguments: {flag}")
    assert (f"(the nearest: {nearest})" in line) if nearest else "nearest" not in line


def test_model_options_are_read_as_python_numbers_bools_and_none_or_else_as_text():
    options = ["width=4096", "dropout=0.1", "bias=False", "norm=None", "act=gelu", "name='a b'", "sizes=[1, 2]"]
    args = cli.parse_args([word for option in options for word in ("--model-option", option)])

    assert args.model_option == [
        ("width", 4096), ("dropout", 0.1), ("bias", False), ("norm", None), ("act", "gelu"), ("name", "a b"),
        ("sizes", "[1, 2]"),  # scalars only: build_model() reads a list out of its text if it wants one
    ]  # fmt: skip
    assert cli.parse_args([]).model_option == []


def test_a_model_option_that_is_not_name_equals_value_is_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["--model-option", "4096"])

    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: argument --model-option: must be NAME=VALUE (a parameter of build_model() in model.py), got 4096 "
        "(run.py --help lists the flags)"
    ]


def test_a_model_option_build_model_does_not_take_ends_the_run_in_one_line_naming_those_it_takes(
    project_root, tmp_path
):
    from {{ cookiecutter.project_slug }}.model import build_model

    result = subprocess.run(
        [sys.executable, "run.py", "--model-option", "depth=3", "--device", "cpu", "--output-dir", str(tmp_path)],
        cwd=project_root, env={name: value for name, value in os.environ.items() if name not in LAUNCHER_VARIABLES},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    takes = [name for name in inspect.signature(build_model).parameters if name != "num_classes"]
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error")] == [
        f"error: --model-option depth: build_model() in model.py takes no such parameter; it takes {', '.join(takes)}"
    ]


@pytest.mark.parametrize("script", ["run.py", "predict.py"])
def test_ctrl_c_while_the_framework_loads_ends_the_script_without_a_traceback(project_root, script):
    started = subprocess.Popen(
        [sys.executable, script, "--help"], cwd=project_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # (as a terminal's job has it)
    )  # fmt: skip
    maps = Path(f"/proc/{started.pid}/maps")
    deadline = time.monotonic() + 60
    while started.poll() is None and not re.search(r"lib(torch|paddle)", maps.read_text()):  # the framework loads
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started.send_signal(signal.SIGINT)
    _, said = started.communicate(timeout=60)

    assert (started.returncode, said) == (130, "")
