"""Refuse answers that cannot bake a working project, before anything is written.

Answers arrive as JSON (``tojson``), so quotes or backslashes in a project name
cannot break this file.
"""

import json
import sys

LAUNCHERS = {
    "pytorch": ("torchrun", "spawn", "launch"),
    "paddle": ("launch", "spawn", "fleetrun"),
}
RECOMMENDED = {"pytorch": "torchrun", "paddle": "launch"}


def find_problem(answers: dict) -> str | None:
    """Return one line saying what is wrong with the answers, or None."""
    slug = answers["project_slug"]
    if not slug.isidentifier() or not slug.isascii():
        return (
            f"project_slug {slug!r} is not a Python identifier: use ASCII letters, digits and "
            "underscores, not starting with a digit (for example project_slug=my_project)"
        )
    framework, launcher = answers["framework"], answers["launcher"]
    if framework not in LAUNCHERS:
        return f"framework {framework!r} is not supported: use pytorch or paddle"
    if launcher not in LAUNCHERS[framework]:
        return (
            f"launcher {launcher!r} does not work with framework {framework!r}: "
            f"use {' or '.join(LAUNCHERS[framework])} (recommended: launcher={RECOMMENDED[framework]})"
        )
    if framework == "paddle" and launcher == "spawn" and answers["nodes"] == "multi":
        return (
            "launcher 'spawn' with framework 'paddle' runs on one machine only: "
            "for nodes=multi use launcher=launch or launcher=fleetrun"
        )
    return None


if __name__ == "__main__":
    problem = find_problem(json.loads(r"""{{ cookiecutter | tojson }}"""))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(1)
