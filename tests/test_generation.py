"""Baking: every valid answer gives a clean project; every invalid one stops in the hook."""

import py_compile
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import QUESTIONS, TASK_CASES, TEMPLATE, answers_id, pre_gen, run, tool_env, valid_answers
from house import house_problems

SHARED_PACKAGE = {
    "settings",
    "batches",  # which samples go where; what a loader gives the loops: counted, guarded
    "roll_call",  # no silent wait: machines that have not come, ranks that stopped answering; no orphan rank
    "output_folder",  # one job per output folder; the saves kept in it
    "preflight",  # run.sh --check
    "cli",
    "folds",  # --folds K: the folds, their runs, out-of-fold predictions, the CV score
    "options",  # the kinds of values, the task's own flags, --config files and config.yaml
    "trackers",  # --tracking mlflow and wandb
    "errors",
    "logs",
    "archive",
    "preemption",
    "state",
    "platforms",
    "notebook",
    "submission",
    "hardware",  # what this machine has, its network included (standard library only)
    "training",
    "fit",  # how the network trains: the basic loop, or (paddle_api=highlevel) paddle.Model.fit
    "workspace",
    "modelarts",
    "kernel_ranks",
    "seam",
}
FRAMEWORK_PACKAGE = {
    "__init__",
    "distributed",
    "checkpoint",
    "engine",
    "loaders",
    "tracking",
    "inference",
    "framework_probe",  # what run.sh --check asks of the framework
}
SHARED_TESTS = {
    "conftest.py",
    "test_preflight.py",
    "test_archive.py",
    "test_cli.py",
    "test_logs.py",
    "test_preemption.py",
    "test_run.py",
    "test_sampler.py",
    "test_platforms.py",
    "test_notebook.py",
    "test_tracking.py",
    "test_seam.py",
    "test_gpus.py",
    "test_global_batch.py",
    "test_on_gpu.py",
    "test_loading.py",
    "test_speed.py",
    "test_resume_flags.py",
    "test_schedule.py",
    "test_competition.py",
    "test_submission.py",
    "test_ema.py",
    "test_folder_lock.py",
    "test_disk_full.py",
    "test_stalled_ranks.py",
    "test_config.py",
    "test_checkpoint_resume.py",
    "test_evaluate.py",
}
FRAMEWORK_TESTS = {
    "pytorch": {
        "validating.py",
        "test_checkpoint.py",
        "checkpointers.py",
        "test_parity.py",
        "test_launch.py",
        "curves.py",
        "test_clipping.py",
        "test_memory.py",
    },
    "paddle": {
        "test_clipping.py",
        "test_memory.py",
        "validating.py",
        "test_checkpoint.py",
        "checkpointers.py",
        "test_parity.py",
        "test_launch.py",
        "launching.py",
        "curves.py",
        "test_visualdl_records.py",
        "test_long_waits.py",
        "test_sharded_checkpoint.py",
    },
}
ROOT_FILES = {
    "README.md",
    "run.sh",
    "run.py",
    "predict.sh",
    "predict.py",
    "export.py",
    "cv.py",
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-notebook.txt",
    "requirements-tracking.txt",
    "notebook.ipynb",
    "pyproject.toml",
    ".pre-commit-config.yaml",
    ".gitignore",
    "k8s/train.yaml",
    "slurm/train.sbatch",
    "configs/sample.yaml",  # --config examples: the sample task, its folds, a sharded run
    "configs/folds.yaml",
}
JINJA_MARKS = ("{{", "}}", "{%", "%}", "cookiecutter.")
RECOMMENDED = pre_gen.RECOMMENDED
# A task's own files: its three modules (the user's), its sample data, and its tests.
TASK_PACKAGE = {"data", "model", "task"}
SAMPLES = {"classification": "digits", "regression": "diabetes", "segmentation": "digit_masks", "text": "docstrings"}
TASK_TESTS = {
    "classification": {"test_data.py", "test_images.py", "test_images_run.py", "test_predict.py"},
    "regression": {"test_regression.py"},
    "segmentation": {"test_segmentation.py"},
    "text": {"test_text.py"},
}
IMAGE_TASKS = {"classification", "segmentation"}


def expected_files(answers: dict, slug: str = "dist_train") -> set[str]:
    task = answers.get("task", "classification")
    files = set(ROOT_FILES)
    files |= {f"{slug}/{name}.py" for name in SHARED_PACKAGE | FRAMEWORK_PACKAGE | TASK_PACKAGE}
    if task in IMAGE_TASKS:
        files.add(f"{slug}/images.py")
    files |= {f"tests/{name}" for name in TASK_TESTS[task]}
    if answers.get("launcher", RECOMMENDED[answers["framework"]]) != "spawn":
        files.add(f"{slug}/launcher.py")  # runs torchrun, torch.distributed.launch or paddle's launch for run.sh
        if answers["framework"] == "paddle":
            files.add("tests/test_launcher.py")  # the job's status that paddle's launcher gets wrong
    if answers["framework"] == "pytorch":
        files.add(f"{slug}/fsdp.py")  # FSDP2: --strategy fsdp, hsdp
    else:
        files.add(f"{slug}/sharding.py")  # --strategy sharding
    if answers["framework"] == "pytorch" or answers.get("paddle_api") != "highlevel":
        files.add("configs/sharded.yaml")  # (paddle.Model.fit does not shard)
    files |= {f"tests/{name}" for name in SHARED_TESTS | FRAMEWORK_TESTS[answers["framework"]]}
    if answers.get("dataset", "zip") == "zip":
        files.add(f"data/{SAMPLES[task]}.zip")
    return files


def project_files(project: Path) -> set[str]:
    """Every file, except the unpacked sample of dataset=folder (checked on its own)."""
    return {
        path.relative_to(project).as_posix()
        for path in project.rglob("*")
        if path.is_file()
        and not path.relative_to(project).as_posix().startswith(tuple(f"data/{name}/" for name in SAMPLES.values()))
    }


def bake_cases(answers_list: list[dict]) -> list:
    """Every valid combination, in the slow tier but the first of each framework, launcher and dataset: the fast
    tier stays under a minute (each bake is also linted), and CI bakes them all."""
    first = {}
    for index, answers in enumerate(answers_list):
        first.setdefault((answers["framework"], answers["launcher"], answers["dataset"]), index)
    return [
        pytest.param(answers, id=answers_id(answers), marks=[] if index in first.values() else [pytest.mark.slow])
        for index, answers in enumerate(answers_list)
    ]


ALL_VALID = bake_cases([answers for framework in ("pytorch", "paddle") for answers in valid_answers(framework)])
# Each other task: every framework and Paddle API with its sample archive, and PyTorch with the other dataset answers
# (what they change, the hook and the data paths, is the same for both frameworks); in the fast tier each task's first.
TASK_BAKES = [
    pytest.param(answers, id=answers_id(answers), marks=[] if fast else [pytest.mark.slow])
    for answers in (
        {**case, "dataset": dataset} for dataset in QUESTIONS["dataset"] for case in TASK_CASES
        if dataset == "zip" or case["framework"] == "pytorch"
    )
    for fast in [answers["framework"] == "pytorch" and answers["dataset"] == "zip"]
]  # fmt: skip


@pytest.mark.parametrize("answers", ALL_VALID + TASK_BAKES)
def test_every_valid_answer_bakes_a_clean_project(bake, answers):
    project = bake(**answers)

    assert project_files(project) == expected_files(answers)
    for path in project.rglob("*"):
        if path.is_file() and path.suffix in {".py", ".sh", ".sbatch", ".md", ".txt", ".toml", ".yaml", ".ipynb"}:
            text = path.read_text(encoding="utf-8")
            assert not any(mark in text for mark in JINJA_MARKS), f"unrendered Jinja in {path}"
        if path.suffix == ".py":
            py_compile.compile(str(path), doraise=True)
    nbformat.validate(nbformat.read(project / "notebook.ipynb", as_version=4))
    lint = run(["ruff", "check", "--no-cache", "."], project)
    assert lint.returncode == 0, lint.stdout
    shellcheck = run(["shellcheck", "run.sh", "slurm/train.sbatch"], project)
    assert shellcheck.returncode == 0, shellcheck.stdout
    assert house_problems(project) == ([], {}, 0)  # imports go one way, down; no module much over 400 lines


INVALID = [
    ({"framework": "pytorch", "launcher": "fleetrun"}, "launcher 'fleetrun' does not work with framework 'pytorch'"),
    ({"framework": "paddle", "launcher": "torchrun"}, "launcher 'torchrun' does not work with framework 'paddle'"),
    ({"framework": "paddle", "launcher": "spawn", "nodes": "multi"}, "nodes=multi use launcher=launch"),
    ({"project_name": "2 Fast"}, "project_slug '2_fast' is not a Python identifier"),
]


@pytest.mark.parametrize("answers, message", INVALID, ids=[answers_id(a) for a, _ in INVALID])
def test_an_invalid_answer_stops_with_one_line_and_leaves_no_folder(tmp_path, answers, message):
    command = [sys.executable, "-m", "cookiecutter", "--no-input", str(TEMPLATE), "-o", str(tmp_path)]
    result = subprocess.run(
        command + [f"{key}={value}" for key, value in answers.items()],
        capture_output=True,
        text=True,
        env=tool_env(),
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert list(tmp_path.iterdir()) == []


def read_settings(project: Path, slug: str = "dist_train") -> dict:
    namespace: dict = {}
    exec((project / slug / "settings.py").read_text(encoding="utf-8"), namespace)
    return {key: value for key, value in namespace.items() if key.isupper()}


@pytest.mark.parametrize("framework, launcher", [("pytorch", "torchrun"), ("paddle", "launch")])
def test_an_unset_launcher_resolves_to_the_frameworks_recommended_one(bake, framework, launcher):
    project = bake(framework=framework)
    assert read_settings(project)["LAUNCHER"] == launcher
    assert launcher in (project / "run.sh").read_text(encoding="utf-8").splitlines()[1]


def test_a_folder_project_ships_the_sample_images_unpacked(bake):
    project = bake(dataset="folder")
    for split, count in (("train", 1437), ("val", 360)):
        images = list((project / "data" / "digits" / split).glob("*/*.png"))
        assert len(images) == count
        assert {image.parent.name for image in images} == {str(digit) for digit in range(10)}
    # git keeps them (a zip project's git ignores data/*/, the archive's extraction)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    ignored = subprocess.run(["git", "check-ignore", "data/digits/train/0"], cwd=project, capture_output=True)
    assert ignored.returncode == 1, ignored.stdout


@pytest.mark.parametrize(
    "name, slug",
    [("My Project", "my_project"), ('He said "hi" \\ o\'k', "he_said_hi_o_k"), ("分布式训练", "fen_bu_shi_xun_lian")],
)
def test_names_with_spaces_quotes_or_chinese_bake_a_valid_slug(bake, name, slug):
    project = bake(project_name=name)
    assert project.name == slug
    assert read_settings(project, slug)["FRAMEWORK"] == "pytorch"
    assert name in (project / "README.md").read_text(encoding="utf-8").splitlines()[0]
    nbformat.validate(nbformat.read(project / "notebook.ipynb", as_version=4))


@pytest.mark.parametrize("framework", ["pytorch", "paddle"])
def test_every_project_has_a_gpu_tier_that_a_machine_without_a_gpu_skips_saying_why(bake, framework):
    project = bake(framework=framework)

    collected = run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider"], project
    )
    tier = [line for line in collected.stdout.splitlines() if "::" in line]
    assert collected.returncode == 0 and len(tier) >= 10, collected.stdout
    # The GPU tier: test_on_gpu.py, and the sample task's own GPU test (its accuracy on a GPU).
    gpu_files = ("tests/test_on_gpu.py::", *(f"tests/{name}::" for name in TASK_TESTS["classification"]))
    assert all(line.startswith(gpu_files) for line in tier)

    ran = run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider"], project)
    assert ran.returncode == 0, ran.stdout
    assert f"{len(tier)} skipped" in ran.stdout
    assert "the GPU tier needs 1 usable GPU(s), this machine has 0" in ran.stdout


# The options each task's files declare (data.py's OPTIONS and PREDICT_OPTIONS), beside run.py's and predict.py's own.
TASK_OPTIONS = {
    "classification": ({"--labels-csv", "--val-fraction", "--image-size", "--channels"},
                       {"--sample-submission", "--probabilities"}),
    "regression": ({"--target", "--val-fraction"}, {"--sample-submission"}),
    "segmentation": ({"--val-fraction", "--image-size", "--channels", "--num-classes"},
                     {"--sample-submission", "--rle-order"}),
    "text": ({"--val-fraction"}, {"--sample-submission", "--probabilities"}),
}  # fmt: skip
EVERY_TASK_OPTION = set().union(*(run | predict for run, predict in TASK_OPTIONS.values()))


def flags_in_help(project: Path, script: str) -> set[str]:
    result = run(["python", script, "--help"], project)
    assert result.returncode == 0, result.stderr
    return {word.strip("[],") for word in result.stdout.split() if word.startswith(("--", "[--"))}


@pytest.mark.parametrize("task", QUESTIONS["task"])
def test_help_lists_the_options_the_tasks_files_declare_and_no_other_tasks(bake, task):
    project = bake(task=task)
    run_options, predict_options = TASK_OPTIONS[task]

    assert flags_in_help(project, "run.py") & EVERY_TASK_OPTION == run_options
    assert flags_in_help(project, "predict.py") & EVERY_TASK_OPTION == predict_options


def test_a_new_option_declared_in_data_py_reaches_build_datasets_and_a_removed_one_is_refused(bake):
    project = bake(task="text", dataset="synthetic")
    data = project / "dist_train" / "data.py"
    source = data.read_text(encoding="utf-8").replace(
        "OPTIONS = {\n",
        'OPTIONS = {\n    "--max-length": {"type": "positive_int", "default": 128, "help": "tokens kept"},\n',
        1,
    )
    source = source.replace('    "--val-fraction": {', '    "--no-val-fraction": {', 1)  # (an entry renamed away)
    data.write_text(source + "\n\n_build = build_datasets\n\n\ndef build_datasets(args):  # noqa: F811\n"
                    '    print("max_length", args.max_length)\n    return _build(args)\n', encoding="utf-8")  # fmt: skip
    read = "from dist_train import cli, seam; seam.Task().datasets(cli.parse_args(['--max-length', '64']))"

    result = run(["python", "-c", read], project)
    refused = run(["python", "run.py", "--val-fraction", "0.2"], project)

    assert "--max-length" in flags_in_help(project, "run.py")
    assert "max_length 64" in result.stdout, result.stderr[-2000:]
    assert refused.returncode == 2 and "unrecognized arguments: --val-fraction 0.2" in refused.stderr
