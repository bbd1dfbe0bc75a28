"""--config FILE.yaml: a file of run.py's options, and OUTPUT_DIR/config.yaml, the options a run was given, which
repeats it."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_bash, run_sh

from {{ cookiecutter.project_slug }} import cli, notebook, options

EXAMPLES = Path(__file__).resolve().parents[1] / "configs"
TASK_OPTIONS = [flag[2:] for file in options.TASK_FILES for flag in options.declared_in(file, "OPTIONS") or {}]


def config(folder: Path, text: str) -> str:
    path = folder / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def refusal(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args(list(argv))
    assert stopped.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    return line


def test_a_config_files_values_are_the_runs_and_flags_given_too_win(tmp_path):
    file = config(tmp_path, "epochs: 7\nbatch_size: 8\nlr: 0.2\namp: false\nsync-bn: true\ntracking: none\n")

    args = cli.parse_args(["--config", file, "--lr", "0.3"])

    assert (args.epochs, args.batch_size, args.lr, args.amp, args.sync_bn) == (7, 8, 0.3, False, True)
    assert args.tracking == "none"
    assert cli.parse_args(["--config", file, "--tracking"]).tracking == cli.TRACKERS[0]  # a bare flag: the default


def test_a_list_gives_a_repeatable_option_each_value_and_the_command_lines_own_replace_them(tmp_path):
    file = config(tmp_path, "model-option: [width=64, dropout=0.1]\n")

    assert cli.parse_args(["--config", file]).model_option == [("width", 64), ("dropout", 0.1)]
    assert cli.parse_args(["--config", file, "--model-option", "width=8"]).model_option == [("width", 8)]


def test_relative_paths_in_a_config_are_read_from_its_folder(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    file = config(tmp_path / "configs", "data-dir: ../data/mine\noutput-dir: runs/a\ninit-from: ~/weights.pt\n")
    monkeypatch.chdir("/")

    args = cli.parse_args(["--config", file])

    assert Path(args.data_dir) == tmp_path / "data" / "mine"
    assert Path(args.output_dir) == tmp_path / "configs" / "runs" / "a"
    assert args.init_from == os.path.expanduser("~/weights.pt")


def test_a_key_that_is_no_option_is_one_line_naming_the_nearest_of_every_option_the_task_ones_too(tmp_path, capsys):
    assert refusal(capsys, "--config", config(tmp_path, "batch_sise: 8\n")).startswith(
        f"error: --config {tmp_path / 'run.yaml'}: batch_sise is no option (the nearest: batch-size)"
    )
    task_option = TASK_OPTIONS[0]
    misspelt = task_option[:-1] + "x"
    assert f"(the nearest: {task_option})" in refusal(capsys, "--config", config(tmp_path, f"{misspelt}: 1\n"))


@pytest.mark.parametrize(
    "text, said",
    [
        ("epochs: 0\n", "argument --epochs: must be at least 1, got 0 in --config"),
        ("epochs: [1, 2]\n", "epochs takes one value, not a list"),
        ("amp: 3\n", "amp is on or off: true or false, not 3"),
        ("- epochs\n", "must map option names to values"),
        ("epochs: [\n", "is not YAML"),
        ("config: other.yaml\n", "a config file cannot name another"),
        ("grad-accum: 2\nglobal-batch-size: 64\n", "--global-batch-size: not allowed with argument --grad-accum"),
        ("output-dir: false\n", "output-dir takes a value, not false"),
        ("output-dir: {a: 1}\n", "output-dir takes a value, not a mapping"),
        ("help: true\n", "help is no option"),
        ("epochs: 3\nepochs: 4\n", "epochs is given twice"),
        ("batch-size: 3\nbatch_size: 4\n", "batch_size is given twice"),
        ("EPOCHS: 3\n", "(the nearest: epochs)"),
        ("learning_rate: 0.1\n", "(the nearest: lr)"),
        ("fold: 1\n", "--fold needs --folds K"),  # checked after parsing, a value of the file's all the same
    ],
)
def test_a_bad_config_is_one_line_naming_the_file(tmp_path, capsys, text, said):
    line = refusal(capsys, "--config", config(tmp_path, text))

    assert said in line and str(tmp_path / "run.yaml") in line


def test_a_missing_config_or_one_not_in_utf_8_is_one_line(tmp_path, capsys):
    assert "No such file" in refusal(capsys, "--config", str(tmp_path / "none.yaml"))
    (tmp_path / "notepad.yaml").write_bytes("epochs: 3\n".encode("utf-16"))
    assert "is not UTF-8 text" in refusal(capsys, "--config", str(tmp_path / "notepad.yaml"))


def test_false_is_the_no_flag_an_empty_path_the_default_and_the_platforms_own_names_are_options(tmp_path):
    args = cli.parse_args(["--config", config(tmp_path, "tracking: false\noutput-dir: ''\ndata_url: /data\n")])

    assert args.tracking == "none"
    assert args.output_dir == cli.parse_args([]).output_dir
    assert args.data_url == "/data"


def test_a_flag_of_the_exclusive_pair_replaces_the_files_other(tmp_path):
    args = cli.parse_args(["--config", config(tmp_path, "grad-accum: 2\n"), "--global-batch-size", "64"])

    assert (args.grad_accum, args.global_batch_size) == (1, 64)


def test_config_yaml_holds_the_options_as_given_and_reads_back_to_the_same_run(tmp_path):
    given = ["--epochs", "3", "--lr", "0.1", "--model-option", "width=64", "--strategy", cli.STRATEGIES[-1]]
    args = cli.parse_args([*given, "--output-dir", str(tmp_path / "a"), "--evaluate", "--resume", "none"])

    options.record(options.of_run(args), args.output_dir, is_main=True, resumed=False)
    written = yaml.safe_load((tmp_path / "a" / options.CONFIG).read_text(encoding="utf-8"))
    again = cli.parse_args(["--config", str(tmp_path / "a" / options.CONFIG)])

    assert written["model-option"] == ["width=64"] and written["strategy"] == cli.STRATEGIES[-1]  # not derived
    assert not {"check", "evaluate", "resume", "local-rank", "train_url", "data_url", "config"} & written.keys()
    assert again.as_given == args.as_given
    assert (again.epochs, again.lr, again.model_option) == (3, 0.1, [("width", 64)])


def test_a_resumed_run_with_changed_options_says_which(tmp_path, caplog):
    first = cli.parse_args(["--epochs", "2", "--output-dir", str(tmp_path)])
    options.record(options.of_run(first), tmp_path, is_main=True, resumed=False)
    later = cli.parse_args(["--config", str(tmp_path / options.CONFIG), "--epochs", "4", "--lr", "0.2"])

    with caplog.at_level(logging.INFO):
        changed = options.record(options.of_run(later), tmp_path, is_main=True, resumed=True)

    assert changed == {"epochs": (2, 4), "lr": (None, 0.2)}
    assert "options changed since the run's last start: epochs 2 -> 4; lr (default) -> 0.2" in caplog.text
    assert yaml.safe_load((tmp_path / options.CONFIG).read_text(encoding="utf-8"))["epochs"] == 4


def test_a_resume_not_given_its_warmup_again_records_the_warmup_it_keeps(tmp_path):
    first = cli.parse_args(["--epochs", "2", "--warmup-epochs", "1", "--output-dir", str(tmp_path)])
    options.record(options.of_run(first), tmp_path, is_main=True, resumed=False)
    later = cli.parse_args(["--epochs", "4", "--output-dir", str(tmp_path)])

    changed = options.record(options.of_run(later), tmp_path, is_main=True, resumed=True)

    assert changed == {"epochs": (2, 4)}  # not "warmup-epochs 1 -> (default)": the resumed run warms up as before
    written = yaml.safe_load((tmp_path / options.CONFIG).read_text(encoding="utf-8"))
    assert written["warmup-epochs"] == 1  # what --config repeats


def test_a_resumed_run_that_trains_nothing_leaves_config_yaml_as_the_run_that_trained(tmp_path):
    trained = cli.parse_args(["--epochs", "3", "--output-dir", str(tmp_path)])
    options.record(options.of_run(trained), tmp_path, is_main=True, resumed=False)
    shorter = cli.parse_args(["--epochs", "1", "--output-dir", str(tmp_path)])

    changed = options.record(options.of_run(shorter), tmp_path, is_main=True, resumed=True, trains=False)

    assert changed == {"epochs": (3, 1)}  # still said
    assert yaml.safe_load((tmp_path / options.CONFIG).read_text(encoding="utf-8"))["epochs"] == 3


def test_each_fold_records_its_own_number(tmp_path):
    args = cli.parse_args(["--folds", "3", "--fold", "1", "--output-dir", str(tmp_path)])

    assert options.of_run(args)["fold"] == 1 and options.of_run(args)["output-dir"] == str(tmp_path)


@pytest.mark.parametrize("example", sorted(path.name for path in EXAMPLES.glob("*.yaml")))
def test_each_example_config_is_read_without_a_complaint(example):
    args = cli.parse_args(["--config", str(EXAMPLES / example)])

    assert Path(args.as_given["output-dir"]).parent == EXAMPLES.parent / "output"


def test_the_notebook_takes_a_config_too(tmp_path):
    args = notebook.parse(["--lr", "0.3"], config=config(tmp_path, "epochs: 2\nlr: 0.1\n"))

    assert (args.epochs, args.lr) == (2, 0.3)


def test_run_sh_puts_the_outputs_where_the_config_says(project_root, tmp_path):
    file = config(tmp_path, "output-dir: elsewhere\n")
    env = {**os.environ, "DRY_RUN": "1", "NPROC_PER_NODE": "1"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]

    said = subprocess.run(
        ["bash", "run.sh", "--config", file], cwd=project_root, env=env, capture_output=True, text=True, check=True
    ).stdout

    assert f"outputs in {tmp_path / 'elsewhere'}" in said


def wandb_records(run: Path) -> list:
    """The records of a W&B offline run, its run-<id>.wandb file (what `wandb sync` sends): a LevelDB-style log of
    32 KiB blocks after a 7-byte file header, each record in pieces behind a 7-byte header (checksum, length, kind:
    1 whole, 2 first, 3 middle, 4 last), read back as wandb's own protobuf Records."""
    from wandb.proto.wandb_internal_pb2 import Record

    [log] = run.glob("run-*.wandb")
    data, records, pieces, at = log.read_bytes(), [], b"", 7
    while at + 7 <= len(data):
        if 32768 - at % 32768 < 7:  # a block's end too short for a header: padding
            at += 32768 - at % 32768
            continue
        length, kind = int.from_bytes(data[at + 4 : at + 6], "little"), data[at + 6]
        pieces, at = pieces + data[at + 7 : at + 7 + length], at + 7 + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def wandb_values(records: list, kind: str) -> list[dict]:
    """Each `kind` record's values ("history": a logged row; "summary": an update of the run's summary)."""
    items = {"history": lambda r: r.history.item, "summary": lambda r: r.summary.update}[kind]
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items(record)}
        for record in records
        if record.WhichOneof("record_type") == kind
    ]


def without_times(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in ("epoch_time_s", "data_wait")} for row in metrics]


def read_metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_config_yaml_repeats_a_run_and_wandb_keeps_it_offline_and_continues_it_on_resume(
    project_root, tmp_path, monkeypatch
):
    first, again = tmp_path / "first", tmp_path / "again"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # where W&B would write beside the output folder
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    # --log-every 3: a loss logged within an epoch of every task (regression's has 6 steps)
    run_sh(project_root, first, "--epochs", "2", "--tracking", "wandb", "--log-every", "3")
    recorded = first / options.CONFIG

    run_bash(project_root, "run.sh", "--config", str(recorded), "--output-dir", str(again), "--tracking", "none")
    said = run_bash(project_root, "run.sh", "--config", str(recorded), "--epochs", "3")

    assert without_times(read_metrics(again)) == without_times(read_metrics(first)[:2])
    assert "options changed since the run's last start: epochs 2 -> 3" in said
    assert yaml.safe_load(recorded.read_text(encoding="utf-8"))["epochs"] == 3
    started, resumed = sorted((first / "wandb").glob("offline-run-*"))  # what `wandb sync` sends, one per start
    run_id = json.loads((first / "tracker_runs.json").read_text(encoding="utf-8"))["wandb"]
    assert started.name.endswith(run_id) and resumed.name.endswith(run_id)  # the same W&B run, continued
    records = wandb_records(started)
    [run] = [record.run for record in records if record.WhichOneof("record_type") == "run"]
    parameters = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert (parameters["epochs"], parameters["tracking"]) == (2, "wandb")
    epochs = [row for row in wandb_values(records, "history") if "epoch" in row]
    epochs += [row for row in wandb_values(wandb_records(resumed), "history") if "epoch" in row]
    metrics = read_metrics(first)
    assert [row["epoch"] for row in epochs] == [1, 2, 3]
    for row, record in zip(epochs, metrics, strict=True):
        assert {f"epoch/{k}": v for k, v in record.items() if k != "epoch"} == pytest.approx(
            {k: v for k, v in row.items() if k.startswith("epoch/")}
        )
    assert any("train/loss" in row for row in wandb_values(records, "history"))
    summaries = wandb_values(wandb_records(resumed), "summary")
    best = [row["best_checkpoint"] for row in summaries if "best_checkpoint" in row]
    assert best and Path(best[-1]).parent == first / "checkpoints"
    runs = [record.run for record in wandb_records(resumed) if record.WhichOneof("record_type") == "run"]
    assert "changed.epochs" in {tag for run in runs for tag in run.tags}
    assert not list((tmp_path / "home").rglob("*wandb*"))  # its files are all under the output folder
    assert list((first / "wandb").rglob("core-debug-*.log"))


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(path.name for path in EXAMPLES.glob("*.yaml")))
def test_each_example_config_trains_on_two_processes(project_root, tmp_path, example):
    output = tmp_path / "output"
    asked = yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8"))
    one_fold = ["--fold", "0"] if asked.get("folds") else []  # (the others the same way)

    run_sh(project_root, output, "--config", str(EXAMPLES / example), "--epochs", "1", *one_fold)

    run = output / "fold-0" if one_fold else output
    assert [row["epoch"] for row in read_metrics(run)] == [1]
    ran = yaml.safe_load((run / options.CONFIG).read_text(encoding="utf-8"))
    chosen = {key: value for key, value in asked.items() if value is not None}
    del chosen["epochs"], chosen["output-dir"]  # (given on the command line, which wins)
    chosen.pop("fold", None)
    assert {key: ran[key] for key in chosen} == chosen
