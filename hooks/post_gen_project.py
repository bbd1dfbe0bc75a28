"""Put the chosen framework's and task's files in place and remove what the answers do not need.

The template keeps each framework's Python files whole, under _pytorch/ and
_paddle/, and each task's under _tasks/<task>/: its data.py and task.py (one for both
frameworks: task.py's import names the framework at baking), its model.py under _pytorch/
and _paddle/, its sample data and its own tests; the image tasks share _tasks/images.py.
This hook moves one set of each into the project and deletes the rest.
"""

import json
import shutil
import zipfile
from pathlib import Path

FRAMEWORK_DIRS = ("_pytorch", "_paddle")
TASKS_DIR = Path("_tasks")
DATA_DIR = Path("data")
PADDLE_VARIANTS = Path("variants")
IMAGE_TASKS = ("classification", "segmentation")  # their data.py reads images with _tasks/images.py


def move_tree(source: Path, destination: Path) -> None:
    """Every file under `source` to the same place under `destination` (over what is there)."""
    for path in sorted(source.rglob("*")):
        if path.is_file():
            target = destination / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            path.replace(target)


def use_framework_files(framework: str) -> None:
    move_tree(Path(f"_{framework}"), Path("."))


def remove_framework_dirs() -> None:
    for name in FRAMEWORK_DIRS:
        shutil.rmtree(name, ignore_errors=True)


def use_task_files(task: str, framework: str, package: str) -> None:
    """The task's data.py and task.py and the framework's model.py into the package (with the image helpers for an
    image task), its sample data into data/, its tests (if it has some of its own) into tests/."""
    source = TASKS_DIR / task
    move_tree(source / f"_{framework}", Path(package))
    for module in source.glob("*.py"):
        module.replace(Path(package, module.name))
    if task in IMAGE_TASKS:
        (TASKS_DIR / "images.py").replace(Path(package, "images.py"))
    move_tree(source / "data", DATA_DIR)
    if (source / "tests").is_dir():
        move_tree(source / "tests", Path("tests"))
    shutil.rmtree(TASKS_DIR)


def use_paddle_variant(variant: str, destination: str) -> None:
    """Paddle: put variants/<variant> in place (over the file the default answers use, if there is one)."""
    (PADDLE_VARIANTS / variant).replace(destination)


def remove_paddle_variants() -> None:
    shutil.rmtree(PADDLE_VARIANTS)


def remove_launcher_module(package: str) -> None:
    """spawn: run.py starts its own processes, no launcher to wrap (nor to test)."""
    Path(package, "launcher.py").unlink()
    Path("tests", "test_launcher.py").unlink(missing_ok=True)


def unpack_sample_archive() -> None:
    """dataset=folder: ship the sample data already unpacked, as such projects expect."""
    for sample in sorted(DATA_DIR.glob("*.zip")):
        with zipfile.ZipFile(sample) as archive:
            archive.extractall(sample.with_suffix(""))
        sample.unlink()


def remove_sample_data() -> None:
    shutil.rmtree(DATA_DIR)


def main(answers: dict) -> None:
    use_framework_files(answers["framework"])
    remove_framework_dirs()
    use_task_files(answers["task"], answers["framework"], answers["project_slug"])
    if answers["launcher"] == "spawn":
        remove_launcher_module(answers["project_slug"])
    if answers["framework"] == "paddle":
        package = answers["project_slug"]
        if answers["paddle_api"] == "highlevel":
            use_paddle_variant("fit.py", f"{package}/fit.py")
            Path("configs", "sharded.yaml").unlink()  # paddle.Model.fit trains in its own DataParallel: no sharding
        remove_paddle_variants()
    if answers["dataset"] == "folder":
        unpack_sample_archive()
    elif answers["dataset"] == "synthetic":
        remove_sample_data()


if __name__ == "__main__":
    main(json.loads(r"""{{ cookiecutter | tojson }}"""))
