"""Put the chosen framework's files in place and remove what the answers do not need.

The template keeps each framework's Python files whole, under _pytorch/ and
_paddle/; this hook moves one set into the project and deletes the rest.
"""

import json
import shutil
import zipfile
from pathlib import Path

FRAMEWORK_DIRS = ("_pytorch", "_paddle")
SAMPLE_ARCHIVE = Path("data/digits.zip")
PADDLE_VARIANTS = Path("variants")


def use_framework_files(framework: str) -> None:
    source = Path(f"_{framework}")
    for path in sorted(source.rglob("*")):
        if path.is_file():
            destination = path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            path.replace(destination)


def remove_framework_dirs() -> None:
    for name in FRAMEWORK_DIRS:
        shutil.rmtree(name, ignore_errors=True)


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
    with zipfile.ZipFile(SAMPLE_ARCHIVE) as archive:
        archive.extractall(SAMPLE_ARCHIVE.with_suffix(""))
    SAMPLE_ARCHIVE.unlink()


def remove_sample_data() -> None:
    shutil.rmtree(SAMPLE_ARCHIVE.parent)


def main(answers: dict) -> None:
    use_framework_files(answers["framework"])
    remove_framework_dirs()
    if answers["launcher"] == "spawn":
        remove_launcher_module(answers["project_slug"])
    if answers["framework"] == "paddle":
        package = answers["project_slug"]
        if answers["paddle_api"] == "highlevel":
            use_paddle_variant("training_highlevel.py", f"{package}/training.py")
            use_paddle_variant("fit.py", f"{package}/fit.py")
        remove_paddle_variants()
    if answers["dataset"] == "folder":
        unpack_sample_archive()
    elif answers["dataset"] == "synthetic":
        remove_sample_data()


if __name__ == "__main__":
    main(json.loads(r"""{{ cookiecutter | tojson }}"""))
