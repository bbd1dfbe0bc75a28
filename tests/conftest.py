"""Shared helpers for the template's tests: answers, baking, running baked projects."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parent.parent
LAUNCHERS = {"pytorch": ("torchrun", "spawn", "launch"), "paddle": ("launch", "spawn", "fleetrun")}


def valid_answers(framework: str) -> list[dict]:
    """Every combination of answers the template accepts for a framework."""
    combos = []
    apis = ("basic", "highlevel") if framework == "paddle" else ("basic",)
    for launcher, nodes, dataset, install, api in itertools.product(
        LAUNCHERS[framework], ("single", "multi"), ("zip", "folder", "synthetic"), ("no", "yes"), apis
    ):
        if framework == "paddle" and launcher == "spawn" and nodes == "multi":
            continue
        combos.append(
            {
                "framework": framework,
                "launcher": launcher,
                "nodes": nodes,
                "dataset": dataset,
                "install_requirements": install,
                "paddle_api": api,
            }
        )
    return combos


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
