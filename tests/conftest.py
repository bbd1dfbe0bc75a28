"""Shared helpers for the template's tests: answers, baking, running baked projects."""

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parent.parent
QUESTIONS = json.loads((TEMPLATE / "cookiecutter.json").read_text(encoding="utf-8"))
CHOICES = ("framework", "nodes", "dataset", "install_requirements", "paddle_api")

# The end of model.py in a test that stops or loses a job part-way through an epoch: every step 50 ms longer.
SLOW_STEPS = """

import time

_build_model = build_model


def build_model(num_classes):  # noqa: F811 - a test slows every step
    model = _build_model(num_classes)
    model.register_forward_pre_hook(lambda module, inputs: time.sleep(0.05))
    return model
"""


def load_hook(name: str):
    """A hook of the template as a module (its Jinja sits in a string under `if __name__ == "__main__"`)."""
    spec = importlib.util.spec_from_file_location(name, TEMPLATE / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pre_gen = load_hook("pre_gen_project")
LAUNCHERS = pre_gen.LAUNCHERS  # the one launcher table, the hook's own


def valid_answers(framework: str) -> list[dict]:
    """Every combination of cookiecutter.json's choices that the hook accepts, for a framework.

    paddle_api means something to Paddle projects only: PyTorch ones are baked with its default.
    """
    options = {name: QUESTIONS[name] for name in CHOICES} | {"framework": [framework], "launcher": LAUNCHERS[framework]}
    if framework != "paddle":
        options["paddle_api"] = QUESTIONS["paddle_api"][:1]
    order = ("framework", "launcher", "nodes", "dataset", "install_requirements", "paddle_api")
    combos = (dict(zip(order, values, strict=True)) for values in itertools.product(*(options[k] for k in order)))
    return [answers for answers in combos if pre_gen.find_problem({"project_slug": "dist_train", **answers}) is None]


# One set of answers per way of starting training: each launcher, and for Paddle each API under each.
LAUNCH_CASES = [{"framework": "pytorch", "launcher": launcher} for launcher in LAUNCHERS["pytorch"]] + [
    {"framework": "paddle", "launcher": launcher, "paddle_api": api}
    for launcher in LAUNCHERS["paddle"]
    for api in QUESTIONS["paddle_api"]
]
# Each task other than the default, once per framework and Paddle API: tasks are independent of launchers, so the
# launcher matrix stays on the default task.
TASKS = QUESTIONS["task"]
TASK_CASES = [
    {"framework": framework, "task": task, **({"paddle_api": api} if framework == "paddle" else {})}
    for task in TASKS[1:]
    for framework in ("pytorch", "paddle")
    for api in (QUESTIONS["paddle_api"] if framework == "paddle" else [None])
]
# The project a new user of each framework bakes first: the recommended launcher, the basic API.
RECOMMENDED_CASES = [
    answers
    for answers in LAUNCH_CASES
    if answers["launcher"] == pre_gen.RECOMMENDED[answers["framework"]]
    and answers.get("paddle_api", "basic") == "basic"
]


# The `check` lines of `bash run.sh --check`, each printed once by every machine of a multi-machine job.
PREFLIGHT_CHECKS = ("master", "port", "interface", "framework", "code", "data", "output", "shm", "all-reduce", "clocks")


def answers_id(answers: dict) -> str:
    return "-".join(str(value) for value in answers.values())


def tool_env(**extra: str) -> dict:
    """The environment for a baked project's commands: this venv's tools first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run(command: list[str], cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=tool_env(**env), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def bake(cookies):
    """Bake the template with some answers; fail the test with cookiecutter's error if it does not bake."""

    def _bake(**answers) -> Path:
        result = cookies.bake(extra_context=answers)
        assert result.exit_code == 0, f"baking {answers} failed: {result.exception}"
        return Path(result.project_path)

    return _bake


@pytest.fixture(scope="session")
def cluster():
    """A real SLURM cluster of two nodes on this host (tests/slurm_cluster.py), for the whole session."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM test cluster needs root: it installs packages, starts munged and edits /etc/hosts")
    import slurm_cluster

    yield from slurm_cluster.started()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The baked projects' own suites first: they are the longest tests, and started last they would keep one of
    the two test processes busy long after the other ran out of work."""
    items.sort(key=lambda item: item.originalname != "test_a_baked_projects_own_test_suite_passes")
