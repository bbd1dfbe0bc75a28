"""The two framework trees are twins: a module both have exposes the same public names, with the same parameters.

A reader who knows the PyTorch project knows the Paddle one. Helpers only one framework
needs are private (a leading underscore). Compared on baked projects, so that the Python
read is exactly what users get.
"""

import ast
from pathlib import Path

import pytest

FRAMEWORKS = ("pytorch", "paddle")


def public_interface(path: Path) -> dict[str, str]:
    """Each public top-level name, and each public method or attribute of a public class, with its signature."""
    interface = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            interface[node.name] = signature(node)
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    name = member_name(member)
                    if name and (not name.startswith("_") or name == "__init__"):
                        interface[f"{node.name}.{name}"] = signature(member)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                # Names it defines (a, or a, b = ...); an attribute it sets elsewhere (module.hook = ...) defines none.
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                for name in names:
                    if isinstance(name, ast.Name) and not name.id.startswith("_"):
                        interface[name.id] = "a value"
    return interface


def member_name(member: ast.stmt) -> str | None:
    if isinstance(member, ast.FunctionDef):
        return member.name
    if isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name):
        return member.target.id
    if isinstance(member, ast.Assign) and isinstance(member.targets[0], ast.Name):
        return member.targets[0].id
    return None


def signature(node: ast.stmt) -> str:
    """Parameter names, kinds and defaults (not annotations: a tensor type differs by framework)."""
    if not isinstance(node, ast.FunctionDef):
        return "a class" if isinstance(node, ast.ClassDef) else "an attribute"
    arguments = node.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args]
    defaults = [None] * (len(names) - len(arguments.defaults)) + [ast.unparse(d) for d in arguments.defaults]
    listed = [name if default is None else f"{name}={default}" for name, default in zip(names, defaults, strict=True)]
    if arguments.vararg:
        listed.append(f"*{arguments.vararg.arg}")
    listed += [
        arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}"
        for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    ]
    if arguments.kwarg:
        listed.append(f"**{arguments.kwarg.arg}")
    decorators = [ast.unparse(d) for d in node.decorator_list if ast.unparse(d) in ("property", "staticmethod")]
    return f"{'@'.join(['', *decorators]) + ' ' if decorators else ''}({', '.join(listed)})"


@pytest.fixture(scope="module")
def packages(cookies_session) -> dict[str, Path]:
    """The package folder of a baked project of each framework (a launcher that has launcher.py)."""
    baked = {}
    for framework in FRAMEWORKS:
        result = cookies_session.bake(extra_context={"framework": framework, "dataset": "synthetic"})
        assert result.exit_code == 0, result.exception
        baked[framework] = Path(result.project_path) / "dist_train"
    return baked


# What one framework has and the other has not: FSDP2 (--strategy fsdp, hsdp) is PyTorch's, and so is a roll call
# in its rendezvous store (paddle's launcher asks its own master).
FRAMEWORK_ONLY = {"pytorch": {"fsdp.py"}, "paddle": {"sharding.py"}}
FRAMEWORK_ONLY_NAMES = {"distributed.py": {"store_roll_call"}}


def test_both_frameworks_have_the_same_modules(packages):
    modules = {
        framework: sorted(p.name for p in packages[framework].glob("*.py") if p.name not in FRAMEWORK_ONLY[framework])
        for framework in FRAMEWORKS
    }
    assert modules["pytorch"] == modules["paddle"]


def test_twin_modules_expose_the_same_names_with_the_same_parameters(packages):
    drift = []
    for module in sorted(p.name for p in packages["pytorch"].glob("*.py") if p.name not in FRAMEWORK_ONLY["pytorch"]):
        interfaces = {framework: public_interface(packages[framework] / module) for framework in FRAMEWORKS}
        for name in sorted(interfaces["pytorch"].keys() | interfaces["paddle"].keys()):
            if name in FRAMEWORK_ONLY_NAMES.get(module, ()):
                continue
            pytorch, paddle = (interfaces[framework].get(name, "missing") for framework in FRAMEWORKS)
            if pytorch != paddle:
                drift.append(f"{module}: {name}: pytorch {pytorch}, paddle {paddle}")
    assert drift == [], "the twins drifted apart:\n" + "\n".join(drift)


def test_setting_another_modules_attribute_defines_no_name(tmp_path):
    (tmp_path / "a.py").write_text("import threading\n\nthreading.excepthook = print\nLAST, BEST = 1, 2\n")
    assert public_interface(tmp_path / "a.py") == {"LAST": "a value", "BEST": "a value"}


def test_the_comparison_sees_a_drifted_parameter(tmp_path):
    (tmp_path / "a.py").write_text("def setup(device, timeout_s=1800.0):\n    pass\n")
    (tmp_path / "b.py").write_text("def setup(device, timeout_s=1800.0, local_rank_flag=None):\n    pass\n")
    assert public_interface(tmp_path / "a.py") != public_interface(tmp_path / "b.py")
