"""The options a task declares in its own files: data.py's and task.py's OPTIONS (run.py's) and PREDICT_OPTIONS
(predict.py's), plain dicts of add_argument() keywords, read from the files' text."""

import argparse
import ast
from pathlib import Path

from .errors import PlatformError

TASK_FILES = ("data.py", "task.py")  # the user's files that may declare options of run.py and predict.py


def add(parser: argparse.ArgumentParser, name: str, types: dict) -> None:
    """The options data.py and task.py declare in their dict `name` (OPTIONS: run.py's; PREDICT_OPTIONS:
    predict.py's), flag: add_argument()'s keywords, "type" by its name in `types`; where neither declares any, the
    first versions' (FIRST_OPTIONS)."""
    declared = {file: declared_in(file, name) for file in TASK_FILES}
    if all(declared_in(file, dict_name) is None for file in TASK_FILES for dict_name in FIRST_OPTIONS):
        declared = {"task_options.py": FIRST_OPTIONS[name]}  # task files of the first versions, which declare none
    for file, options in declared.items():
        for flag, keywords in (options or {}).items():
            keywords = dict(keywords)
            if keywords.get("type") not in (None, *types):
                raise PlatformError(
                    f"{file}: {name}[{flag!r}] has type {keywords['type']!r}: use one of {', '.join(types)}"
                )
            if "type" in keywords:
                keywords["type"] = types[keywords["type"]]
            try:
                parser.add_argument(flag, **keywords)
            except (argparse.ArgumentError, TypeError, ValueError) as error:
                raise PlatformError(f"{file}: {name}[{flag!r}] cannot be an option ({error})") from None


# The task options of the first versions' run.py and predict.py, for data.py and task.py that declare none (taken
# over unchanged by a template update: CHANGELOG.md).
FIRST_OPTIONS = {
    "OPTIONS": {
        "--labels-csv": {"metavar": "FILE", "help": "labels from a CSV file: image path, class name"},
        "--val-fraction": {"type": "fraction", "default": 0.1, "help": "held out for validation, without a split"},
        "--image-size": {"type": "positive_int", "metavar": "N", "help": "side in pixels images are resized to"},
        "--channels": {"type": "int", "choices": [1, 3], "help": "1: grey, 3: RGB images"},
        "--target": {"default": "target", "metavar": "NAME", "help": "regression: the CSV column to learn"},
        "--num-classes": {"type": "positive_int", "metavar": "N", "help": "segmentation: the number of classes"},
    },
    "PREDICT_OPTIONS": {
        "--sample-submission": {"metavar": "FILE", "help": "a competition's sample CSV, to follow"},
        "--probabilities": {"action": "store_true", "help": "add the predicted class's probability"},
    },
}


def declared_in(file: str, name: str) -> dict | None:
    """The dict `name` of the package's `file` (None where it has none), read from its text: importing the file
    would import the framework, slow to load, and on a GPU build start CUDA in a notebook's kernel (where run.py's
    flags are read too)."""
    path = Path(__file__).with_name(file)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError) as error:
        raise PlatformError(f"{file} cannot be read for its options ({type(error).__name__}: {error})") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
            try:
                options = ast.literal_eval(node.value)
            except ValueError:
                options = None
            if not isinstance(options, dict) or not all(isinstance(value, dict) for value in options.values()):
                raise PlatformError(
                    f"{file}: {name} must be a dict of plain values, flag: add_argument()'s keywords "
                    "(it is read from the file's text)"
                )
            return options
    return None
