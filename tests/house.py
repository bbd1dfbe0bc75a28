"""The baked project's house, read from its code: which project modules each module imports, the circles among
them, the modules over 400 lines, and how many modules there are. Used by test_imports.py and by
test_generation.py's every-answer bake."""

import ast
from pathlib import Path

MAX_LINES = 400
# The package's modules and the scripts beside it, in the largest variant (paddle.Model.fit's, with sharding): a
# feature makes a room of its own only where no room owns its concern (44 before the output folder, the ranks'
# lifetimes and the machine's questions joined the rooms that own them).
MAX_MODULES = 41


def project_modules(project: Path, package: str) -> dict[str, Path]:
    """The package's modules and the scripts beside it (run.py, predict.py), by the name an import uses."""
    modules = {path.stem: path for path in (project / package).glob("*.py") if path.stem != "__init__"}
    return modules | {path.stem: path for path in project.glob("*.py")}


def imported_names(source: str, package: str) -> set[str]:
    """The project modules that `source` imports: at its top or inside functions, relatively or by the
    package's name, and by importlib.import_module("literal name")."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == package):
            inside = (node.module or "").removeprefix(package).lstrip(".") if not node.level else (node.module or "")
            names |= {inside.split(".")[0]} if inside else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith(package + ".")}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                name = node.args[0].value.removeprefix(package).lstrip(".")
                names.add(name.split(".")[0])
    return names


def import_graph(project: Path, package: str) -> dict[str, set[str]]:
    modules = project_modules(project, package)
    return {
        name: imported_names(path.read_text(encoding="utf-8"), package) & modules.keys() - {"__init__"}
        for name, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import one another, directly or through others (Tarjan's algorithm)."""
    order, low, stack, found, counter = {}, {}, [], [], [0]

    def visit(name: str) -> None:
        order[name] = low[name] = counter[0]
        counter[0] += 1
        stack.append(name)
        for other in sorted(graph[name]):
            if other not in order:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], order[other])
        if low[name] == order[name]:
            group = []
            while not group or group[-1] != name:
                group.append(stack.pop())
            if len(group) > 1 or name in graph[name]:
                found.append(sorted(group))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return found


def house_problems(project: Path) -> tuple[list[list[str]], dict[str, int], int]:
    """(the import circles, the modules over MAX_LINES with their lengths, the modules over MAX_MODULES) of a baked
    project: empty, empty and 0 in a house whose imports go one way, down, in few rooms of a readable size."""
    graph = import_graph(project, project.name)
    modules = project_modules(project, project.name)
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    return circles(graph), too_long, max(0, len(modules) - MAX_MODULES)
