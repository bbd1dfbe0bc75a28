"""Where run.py's options come from besides its own flags, and where they go: the kinds of value a flag takes; the
options a task declares in its own files (data.py's and task.py's OPTIONS for run.py, PREDICT_OPTIONS for predict.py,
plain dicts of add_argument() keywords, read from the files' text); a YAML file of options (--config FILE); and
OUTPUT_DIR/config.yaml, the options a run was given or defaulted to, which --config reads back to repeat it."""

import argparse
import ast
import difflib
import logging
import math
import os
from pathlib import Path

import yaml

from . import workspace
from .errors import PlatformError


def number(kind: type, accepted, what: str):
    """An argparse type: `kind` (int, float) of the text, refused in one line unless accepted(value)."""

    def read(text: str):
        try:
            value = kind(text)
        except ValueError:  # (argparse's own line would name this function)
            whole = "a whole number, " if kind is int else ""
            raise argparse.ArgumentTypeError(f"must be {whole}{what}, got {text}") from None
        if not accepted(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    return read


positive_int = number(int, lambda value: value >= 1, "at least 1")
non_negative_int = number(int, lambda value: value >= 0, "0 or more")
# (nan and inf refused too: the waits hand the seconds to the framework and to the file lock)
positive_seconds = number(float, lambda value: 0 < value < math.inf, "a number of seconds above 0")
positive_number = number(float, lambda value: 0 < value < math.inf, "a number above 0")
non_negative_number = number(float, lambda value: 0 <= value < math.inf, "a number, 0 or more")
fraction = number(float, lambda value: 0 < value < 1, "between 0 and 1 (exclusive)")
decay = number(float, lambda value: 0 <= value < 1, "at least 0 and below 1")


def model_option(text: str) -> tuple[str, object]:
    """NAME=VALUE: a keyword argument of build_model(); VALUE read as a Python number, bool or None (4096, 0.1,
    True), else as text."""
    name, equals, value = text.partition("=")
    if not equals or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"must be NAME=VALUE (a parameter of build_model() in model.py), got {text}")
    try:
        read = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        read = value
    # Scalars only, as a checkpoint's description records them (seam.data_description()); a list stays text.
    return name, read if isinstance(read, (bool, int, float, str, type(None))) else value


def path(text: str) -> str:
    """A file or folder (~ expanded: a YAML file's paths pass no shell); --config reads a relative one from the
    file's folder."""
    return os.path.expanduser(text)


def existing_file(text: str) -> str:
    """A file that must be there (a sample submission): said before any work, not after a long prediction."""
    file = path(text)
    if not os.path.isfile(file):
        raise argparse.ArgumentTypeError(
            f"{text} is a folder: name the file" if os.path.isdir(file) else f"no file {text}"
        )
    return file


# The types an option of data.py or task.py may name.
TYPES = {
    "int": int, "float": float, "str": str, "positive_int": positive_int, "positive_number": positive_number,
    "fraction": fraction, "path": path, "file": existing_file,
}  # fmt: skip


TASK_FILES = ("data.py", "task.py")  # the user's files that may declare options of run.py and predict.py


def add(parser: argparse.ArgumentParser, name: str) -> None:
    """The options data.py and task.py declare in their dict `name` (OPTIONS: run.py's; PREDICT_OPTIONS:
    predict.py's), flag: add_argument()'s keywords, "type" by its name in TYPES; where neither declares any, the
    first versions' (FIRST_OPTIONS)."""
    declared = {file: declared_in(file, name) for file in TASK_FILES}
    if all(declared_in(file, dict_name) is None for file in TASK_FILES for dict_name in FIRST_OPTIONS):
        declared = {"options.py": FIRST_OPTIONS[name]}  # task files of the first versions, which declare none
    for file, options in declared.items():
        for flag, keywords in (options or {}).items():
            keywords = dict(keywords)
            if keywords.get("type") not in (None, *TYPES):
                raise PlatformError(
                    f"{file}: {name}[{flag!r}] has type {keywords['type']!r}: use one of {', '.join(TYPES)}"
                )
            if "type" in keywords:
                keywords["type"] = TYPES[keywords["type"]]
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
                options, flag = None, _entry_with_code(node.value)
                if flag is not None:  # (a type unquoted, mostly)
                    raise PlatformError(
                        f"{file}: {name}[{flag!r}] must hold plain values, as it is read from the file's text: "
                        'quote a type ("type": "int")'
                    ) from None
            if not isinstance(options, dict) or not all(isinstance(value, dict) for value in options.values()):
                raise PlatformError(
                    f"{file}: {name} must be a dict of plain values, flag: add_argument()'s keywords "
                    "(it is read from the file's text)"
                )
            return options
    return None


def _entry_with_code(node: ast.expr) -> str | None:
    """The flag of the first entry of the dict `node` whose keywords are not plain values; None where there is none."""
    for flag, keywords in zip(getattr(node, "keys", ()), getattr(node, "values", ()), strict=True):
        try:
            ast.literal_eval(keywords)
        except ValueError:
            if isinstance(flag, ast.Constant):
                return flag.value
    return None


# Configuration files: --config FILE, and the OUTPUT_DIR/config.yaml a run writes.
CONFIG = "config.yaml"
# Not a run's options: what it is asked to do instead of training, where it resumes from, and the platform's own.
NOT_RECORDED = {"config", "check", "evaluate", "resume", "local_rank", "data_url", "train_url", "init_method", "rank"}
NOT_RECORDED |= {"world_size", "help"}
RESUME_WORDS = ("auto", "none")  # --resume's values that are no path
# What a resumed run keeps from its checkpoint unless given again (cli.py's helps): its config.yaml keeps them too
# (its --lr: training.py records the one the checkpoint says its rate comes from).
KEPT_ON_RESUME = ("warmup-epochs", "ema", "global-batch-size")


def with_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with the options of its --config FILE in front, as flags: the command line's own come after them and
    win; one the command line gives replaces the file's, a repeatable one's whole list, and the other of an
    exclusive pair (--grad-accum, --global-batch-size) too. A key that is no option, or a value it cannot take, is one
    `error:` line."""
    finder = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    finder.add_argument("--config", type=path)
    file = workspace.in_workspace(finder.parse_known_args(argv)[0].config)  # (AI Studio: uploaded to its workspace)
    if file is None:
        return argv
    given = set(filter(None, (_action_of(parser, item) for item in argv)))
    for group in parser._mutually_exclusive_groups:
        if given & set(group._group_actions):
            given |= set(group._group_actions)
    flags = []
    for action, key, value in read_config(parser, file):
        if action not in given:
            flags += _as_flags(parser, file, action, key, value)
    parser.source = f"in --config {file}"  # the file's values alone first: a bad one is said to be the file's
    parser.parse_args(flags)
    parser.source = None
    return flags + argv


def read_config(parser: argparse.ArgumentParser, file: str) -> list[tuple[argparse.Action, str, object]]:
    """The file's (option, key, value) triples, null values left out, relative paths made the file's folder's."""
    try:
        values = yaml.load(Path(file).read_text(encoding="utf-8"), Loader=_UniqueKeys)
    except OSError as error:
        where = "" if os.path.isabs(file) else f" ({os.path.abspath(file)})"  # (a relative path: from where)
        parser.error(f"--config {file}{where}: {error.strerror or error}")
    except UnicodeDecodeError:
        parser.error(f"--config {file} is not UTF-8 text: save it as UTF-8")
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        parser.error(
            f"--config {file} is not YAML: {getattr(error, 'problem', None) or error}"
            + (f" (line {where.line + 1})" if where else "")
        )
    if values is None:
        values = {}
    if not isinstance(values, dict):
        parser.error(
            f"--config {file}: must map option names to values (epochs: 10), not hold a {type(values).__name__}"
        )
    actions = {_dashed(name): action for name, action in long_options(parser).items()}
    found, seen = [], set()
    for key, value in values.items():
        name = _dashed(str(key))
        if name == "config":
            parser.error(f"--config {file}: a config file cannot name another")
        if name not in actions:
            close = nearest(name, [option for option in actions if option != "config"])
            parser.error(f"--config {file}: {key} is no option" + (f" (the nearest: {close})" if close else ""))
        if actions[name].dest in seen:
            parser.error(f"--config {file}: {key} is given twice (as dashes and as underscores)")
        seen.add(actions[name].dest)
        if value is not None:
            found.append((actions[name], name, value))
    return found


# What other trainers (Hugging Face's Trainer, Lightning, timm) call options this project names otherwise.
OTHER_NAMES = {
    "learning-rate": "lr",
    "num-epochs": "epochs",
    "num-train-epochs": "epochs",
    "max-epochs": "epochs",
    "num-workers": "workers",
    "gradient-accumulation-steps": "grad-accum",
    "accumulate-grad-batches": "grad-accum",
    "output": "output-dir",
}


def nearest(name: str, names: list[str]) -> str | None:
    """The option of `names` (long names, no dashes) that an unknown `name` most likely meant, or None."""
    name = _dashed(name.lstrip("-").lower())
    if OTHER_NAMES.get(name) in names:
        return OTHER_NAMES[name]
    return next(iter(difflib.get_close_matches(name, names, n=1)), None)


def nearest_to_unknown(message: str, parser: argparse.ArgumentParser) -> str:
    """` (the nearest: --lr)` for argparse's error on flags it does not know (the first of them); else ""."""
    if not message.startswith("unrecognized arguments: --"):
        return ""
    close = nearest(message.split()[2].split("=")[0], list(long_options(parser)))
    return f" (the nearest: --{close})" if close else ""


def _dashed(name: str) -> str:
    return name.replace("_", "-")


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error, not the last one silently."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        for key in keys:
            if keys.count(key) > 1:
                raise yaml.constructor.ConstructorError(None, None, f"{key} is given twice", node.start_mark)
        return super().construct_mapping(node, deep)


def _as_flags(parser, file: str, action: argparse.Action, name: str, value) -> list[str]:
    """The command-line flags that give `action` the file's `value` under the key `name` (a relative path read from
    the file's folder)."""
    flag = next(option for option in action.option_strings if _dashed(option) == f"--{name}")
    if value is False and action.nargs != 0 and f"--no-{name}" in parser._option_string_actions:
        return [f"--no-{name}"]  # (tracking: false)
    if action.nargs == 0:  # an on/off flag
        if not isinstance(value, bool):
            parser.error(f"--config {file}: {name} is on or off: true or false, not {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            on, off = action.option_strings[:2]
            return [on if value == (flag == on) else off]
        return [flag] if value else []
    if isinstance(value, list):
        if not isinstance(action, argparse._AppendAction):
            parser.error(f"--config {file}: {name} takes one value, not a list")
        return [piece for item in value for piece in (flag, str(item))]
    if isinstance(value, dict):
        parser.error(f"--config {file}: {name} takes a value, not a mapping")
    if value is True and action.nargs == "?":
        return [flag]
    if isinstance(value, bool):
        parser.error(f"--config {file}: {name} takes a value, not {str(value).lower()}")
    text = str(value)
    if action.type is path and text and not (action.dest == "resume" and text in RESUME_WORDS):
        text = os.path.normpath(Path(file).parent / os.path.expanduser(text))
    return [flag, text]


def long_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's options by their long names, without the dashes: {"batch-size": its action, ...}."""
    return {
        option[2:]: action
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
    }


def _action_of(parser: argparse.ArgumentParser, item: str) -> argparse.Action | None:
    """The option a command-line item names (a unique prefix too, as argparse reads it), or None."""
    if not item.startswith("--"):
        return None
    name = item.partition("=")[0]
    matches = {action for option, action in parser._option_string_actions.items() if option.startswith(name)}
    exact = parser._option_string_actions.get(name)
    return exact or (matches.pop() if len(matches) == 1 else None)


def as_given(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The options of `args` as parsed, before anything is derived from them, by their long names: what
    config.yaml records (paths absolute: --config reads relative ones from the file's folder)."""
    recorded, seen = {}, set(NOT_RECORDED)
    for name, action in long_options(parser).items():
        if action.dest in seen:  # (--no-tracking: --tracking's)
            continue
        seen.add(action.dest)
        value = getattr(args, action.dest)
        if action.type is path and value is not None:
            value = os.path.abspath(value)
        elif action.type is model_option:
            value = [f"{option}={setting}" for option, setting in value]
        recorded[name] = value
    return recorded


def of_run(args: argparse.Namespace) -> dict:
    """The options config.yaml records for the run of `args` (cli.parse_args()'s; a fold's: its own number)."""
    return {**args.as_given, "fold": args.fold} if args.folds else args.as_given


def record(options: dict, output_dir: str | Path, is_main: bool, resumed: bool, trains: bool = True) -> dict:
    """Write OUTPUT_DIR/config.yaml (rank 0): `options`, as_given()'s, where a resumed run keeps the last start's
    KEPT_ON_RESUME not given again (as training does); a run that `trains` nothing leaves the one that trained (an
    --epochs below the checkpoint's must not become what repeats the run). Return the options that changed since
    the run's last start when it resumes, {name: (was, now)}, each said in the log."""
    path = Path(output_dir) / CONFIG
    changed = {}
    if resumed and path.is_file():
        before = last_start(output_dir)
        kept = {name: before[name] for name in KEPT_ON_RESUME if options.get(name) is None and name in before}
        options = {**options, **kept}
        changed = {
            name: (before.get(name), options.get(name))
            for name in dict.fromkeys([*options, *before])
            if before.get(name) != options.get(name)
        }
        if changed and is_main:
            logging.getLogger(__package__).info(
                "options changed since the run's last start: %s",
                "; ".join(f"{name} {_shown(was)} -> {_shown(now)}" for name, (was, now) in changed.items()),
            )
    if is_main and trains:
        text = f"# This run's options: bash run.sh --config {path.resolve()} repeats it (flags given with it win)\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{CONFIG}.partial")
        partial.write_text(text + yaml.safe_dump(options, sort_keys=False, allow_unicode=True), encoding="utf-8")
        partial.replace(path)
    return changed


def last_start(output_dir: str | Path) -> dict:
    """The options OUTPUT_DIR/config.yaml records of the run's last start ({} without one)."""
    try:
        return yaml.safe_load((Path(output_dir) / CONFIG).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _shown(value) -> str:
    return "(default)" if value is None else str(value)
