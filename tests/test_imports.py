"""The baked project's house: imports go one way, down. No module imports one that stands above it, so none
takes part in a circle; no module is over 400 lines, and there are no more modules than house.MAX_MODULES."""

import subprocess
import sys

import pytest
from conftest import answers_id, valid_answers
from house import circles, house_problems, import_graph


def variant_cases() -> list:
    """The first valid answer of each framework, launcher and Paddle API: the fast tier's; CI's bake of every answer
    (test_generation.py) checks the house of each."""
    first = {}
    for answers in valid_answers("pytorch") + valid_answers("paddle"):
        first.setdefault((answers["framework"], answers["launcher"], answers["paddle_api"]), answers)
    return [pytest.param(answers, id=answers_id(answers)) for answers in first.values()]


def test_a_circle_through_an_import_inside_a_function_or_import_module_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "logs.py").write_text("def bar():\n    from .notebook import in_kernel\n")
    (package / "notebook.py").write_text("import importlib\n\ndef train():\n    importlib.import_module('run')\n")
    (package / "errors.py").write_text("")
    (tmp_path / "run.py").write_text("from pkg import logs, errors\n")

    assert circles(import_graph(tmp_path, "pkg")) == [["logs", "notebook", "run"]]


@pytest.mark.parametrize("answers", variant_cases())
def test_imports_go_one_way_down_in_few_modules_of_at_most_400_lines(bake, answers):
    project = bake(**answers)

    assert house_problems(project) == ([], {}, 0)


def test_the_pytorch_launcher_process_starts_without_fsdps_modules_which_take_seconds_to_import(bake):
    project = bake(framework="pytorch", launcher="torchrun")
    heavy = ("torch.distributed.fsdp", "torch.distributed.checkpoint", "sympy")  # 2.8 s of imports on an H100 host
    script = f"import sys, dist_train.launcher\nprint([name for name in sys.modules if name.startswith({heavy!r})])"

    result = subprocess.run([sys.executable, "-c", script], cwd=project, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
