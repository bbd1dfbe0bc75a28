"""The pre-generation hook's checks, imported and called directly."""

import pytest
from conftest import LAUNCHERS, pre_gen

GOOD = {"project_slug": "my_project", "framework": "pytorch", "launcher": "torchrun", "nodes": "single"}


@pytest.mark.parametrize(
    "framework, launcher, nodes",
    [(fw, launcher, nodes) for fw, launchers in LAUNCHERS.items() for launcher in launchers for nodes in ("single", "multi")
     if not (fw == "paddle" and launcher == "spawn" and nodes == "multi")],
)  # fmt: skip
def test_every_supported_pair_passes(framework, launcher, nodes):
    assert pre_gen.find_problem({**GOOD, "framework": framework, "launcher": launcher, "nodes": nodes}) is None


@pytest.mark.parametrize(
    "changes, named, alternative",
    [
        ({"launcher": "fleetrun"}, "'fleetrun'", "torchrun"),
        ({"framework": "paddle", "launcher": "torchrun"}, "'torchrun'", "launcher=launch"),
        ({"launcher": "mpirun"}, "'mpirun'", "torchrun"),
        ({"framework": "paddle", "launcher": "spawn", "nodes": "multi"}, "'spawn'", "launcher=launch"),
        ({"framework": "jax"}, "'jax'", "pytorch or paddle"),
        ({"project_slug": "2fast"}, "'2fast'", "project_slug=my_project"),
        ({"project_slug": "my-project"}, "'my-project'", "project_slug=my_project"),
        ({"project_slug": "分布式"}, "'分布式'", "ASCII"),
    ],
)
def test_a_pair_that_cannot_work_is_named_with_an_alternative(changes, named, alternative):
    problem = pre_gen.find_problem({**GOOD, **changes})
    assert problem is not None
    assert "\n" not in problem
    assert named in problem and alternative in problem
