"""Template updates: a baked project takes a later template commit's engine changes with `cruft update`, never its
changes to the user's files, and its old task.py keeps working under the new engine.

One scratch copy of the template (a git repository, tagged at its version) and two projects, baked before the
template's change: one with `cruft create`, one with `cookiecutter` and linked with its README's commands."""

import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import QUESTIONS, TEMPLATE, run

pytestmark = pytest.mark.xdist_group("template-updates")  # one test process: the module's tests share one scratch

VERSION = QUESTIONS["_template_version"]
NEW_VERSION = "99.0.0"
README_TEMPLATE_URL = "https://github.com/org/dist-template"
# git commits in the scratch repositories (the README's own commands too), whatever the machine's git config says.
GIT_USER = {
    "GIT_AUTHOR_NAME": "user",
    "GIT_AUTHOR_EMAIL": "user@example.com",
    "GIT_COMMITTER_NAME": "user",
    "GIT_COMMITTER_EMAIL": "user@example.com",
}
HOW = ["created", "linked"]  # baked with cruft create; baked with cookiecutter, then cruft link
USER_CHANGE = "\n# the user's own change\n"
# The template's later commit: an engine that asks task.py for a function that a task.py of VERSION lacks, with a
# fallback, and that function added to every task.py of the template.
MAIN = 'if __name__ == "__main__":\n'
ENGINE_CHANGE = MAIN + (
    "    from {{ cookiecutter.project_slug }} import task\n\n"
    '    print("task:", task.summary() if hasattr(task, "summary") else "a task.py without summary()")\n'
)
TASK_CHANGE = '\n\ndef summary() -> str:\n    return "the template\'s task"\n'
# The baked tests that read the engine, the settings and the user's task.py: the whole fast tier takes 45 s per project.
FAST_TESTS = ["tests/test_cli.py", "tests/test_logs.py", "tests/test_seam.py"]


def git(cwd: Path, *args: str) -> str:
    result = run(["git", *args], cwd, **GIT_USER)
    assert result.returncode == 0, f"git {' '.join(args)}: {result.stderr}"
    return result.stdout


def copy_template(destination: Path) -> Path:
    """The template's files as a clone has them (nothing git ignores), committed and tagged v<VERSION>."""
    for name in git(TEMPLATE, "ls-files", "--cached", "--others", "--exclude-standard").splitlines():
        if (TEMPLATE / name).is_file():  # not a file deleted in a working tree
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TEMPLATE / name, destination / name)
    git(destination, "init", "-q")
    git(destination, "add", "-A")
    git(destination, "commit", "-qm", f"dist-template {VERSION}")
    git(destination, "tag", f"v{VERSION}")
    return destination


def link_block(project: Path) -> str:
    """The README's commands that link a cookiecutter bake to the template."""
    blocks = re.findall(r"```bash\n(.*?)```", (project / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    return next(block for block in blocks if "cruft link" in block)


def change_the_template(template: Path) -> None:
    """A later template commit: a new version, the engine change of ENGINE_CHANGE and TASK_CHANGE in every task.py."""
    questions = template / "cookiecutter.json"
    questions.write_text(questions.read_text().replace(f'"{VERSION}"', f'"{NEW_VERSION}"'))
    run_py = template / "{{cookiecutter.project_slug}}" / "run.py"
    run_py.write_text(run_py.read_text().replace(MAIN, ENGINE_CHANGE))
    for task_py in (template / "{{cookiecutter.project_slug}}" / "_tasks").rglob("task.py"):
        task_py.write_text(task_py.read_text() + TASK_CHANGE)
    git(template, "commit", "-qam", f"dist-template {NEW_VERSION}")


@pytest.fixture(scope="module")
def updated(tmp_path_factory, cookies_session) -> dict[str, Path]:
    """Both projects, each with the user's commit to task.py, after `cruft update -y` to the template's change."""
    root = tmp_path_factory.mktemp("updates")
    template = copy_template(root / "template")

    created = run(["cruft", "create", "--no-input", str(template), "--output-dir", str(root / "created")], root)
    assert created.returncode == 0, created.stderr
    projects = {"created": root / "created" / "dist_train"}
    git(projects["created"], "init", "-q")
    git(projects["created"], "add", "-A")
    git(projects["created"], "commit", "-qm", "baked with cruft create")

    # A name of its own (its answers must reach cruft link), with a quote (the README's shell quoting).
    baked = cookies_session.bake(extra_context={"project_name": "Lab's Net"}, template=str(template))
    assert baked.exit_code == 0, baked.exception
    projects["linked"] = Path(baked.project_path)
    commands = link_block(projects["linked"]).replace(README_TEMPLATE_URL, str(template))
    linked = run(["bash", "-euc", commands], projects["linked"], **GIT_USER)
    assert linked.returncode == 0, linked.stderr

    for project in projects.values():
        with (project / project.name / "task.py").open("a", encoding="utf-8") as task_py:
            task_py.write(USER_CHANGE)
        git(project, "commit", "-qam", "the user's task")
    change_the_template(template)
    for project in projects.values():
        update = run(["cruft", "update", "-y"], project)
        assert update.returncode == 0 and "Good work" in update.stdout, update.stdout + update.stderr
    return projects


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_an_update_brings_the_engine_change_and_leaves_the_users_task_py_as_committed(updated, how):
    project = updated[how]
    package = project / project.name

    assert "task.summary()" in (project / "run.py").read_text(encoding="utf-8")
    assert f'TEMPLATE_VERSION = "{NEW_VERSION}"' in (package / "settings.py").read_text(encoding="utf-8")
    changed = git(project, "diff", "HEAD", "--name-only").split()
    assert {"run.py", f"{project.name}/settings.py", ".cruft.json"} <= set(changed)
    assert f"{project.name}/task.py" not in changed
    task_py = (package / "task.py").read_text(encoding="utf-8")
    assert task_py.endswith(USER_CHANGE) and "def summary" not in task_py
    # Applied cleanly: nothing unmerged, no rejected hunks.
    status = git(project, "status", "--porcelain").splitlines()
    assert not [line for line in status if "U" in line[:2] or line.endswith(".rej")], status


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_an_updated_project_is_up_to_date_and_passes_its_tests(updated, how):
    project = updated[how]

    check = run(["cruft", "check"], project)
    assert check.returncode == 0 and "up to date" in check.stdout, check.stdout + check.stderr
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *FAST_TESTS], project
    )
    assert tests.returncode == 0, tests.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_an_old_task_py_trains_under_an_engine_that_asks_it_for_a_new_function(updated, how, tmp_path):
    project = updated[how]

    trained = run([sys.executable, "run.py", "--epochs", "1", "--output-dir", str(tmp_path)], project)

    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    assert "task: a task.py without summary()" in trained.stdout  # the new engine's fallback
    assert "done: best val_acc" in trained.stdout
    first = (tmp_path / "train.log").read_text(encoding="utf-8").splitlines()[0]
    assert first.endswith(f"{project.name}: dist-template {NEW_VERSION}")


def test_a_bake_records_the_template_version_that_the_changelog_describes(bake):
    project = bake()

    assert f'TEMPLATE_VERSION = "{VERSION}"' in (project / "dist_train" / "settings.py").read_text(encoding="utf-8")
    changelog = (TEMPLATE / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.findall(r"^## (\S+)", changelog, re.MULTILINE)[0] == VERSION  # the newest section
