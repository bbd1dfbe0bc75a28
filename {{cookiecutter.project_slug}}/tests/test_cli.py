"""Flags: where the data comes from, and defaults that do not depend on the working folder."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from {{ cookiecutter.project_slug }} import cli, settings


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

    assert Path(args.data_dir) == cli.SAMPLE_DATA_DIR
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
    ],
)
def test_impossible_numbers_are_refused_before_anything_starts(flag, value, must, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.parse_args([flag, value])

    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: argument {flag}: {must} (run.py --help lists the flags)"]


def test_a_flag_run_py_does_not_know_is_one_line_naming_it_through_run_sh_too(project_root, tmp_path):
    result = subprocess.run(
        ["bash", "run.sh", "--learning-rate", "0.1", "--output-dir", str(tmp_path / "out")],
        cwd=project_root, env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert result.returncode == 2
    assert (result.stdout + result.stderr).splitlines() == [
        "error: unrecognized arguments: --learning-rate 0.1 (run.py --help lists the flags)"
    ]
    assert not (tmp_path / "out").exists()
