"""Tests that grade with the batch grader need its sandbox (bubblewrap); the suite can run on
two processes (``pytest -n 2 --dist loadgroup``, pytest-xdist).

Tests marked ``sandbox`` are skipped where bubblewrap cannot run (with the reason), except in CI
(``CI`` set), where ``.ci/run`` installs it and its absence is a failure.

Each test module runs in one process, so that its module fixtures (a graded class, a JupyterLab
server) are made once; the assignment tests are grouped by assignment and by what they need
(the graded class, or Validate on every variant), so that the three assignments' classes are
graded in whichever process is free.
"""

from __future__ import annotations

import os

import pytest


def _group(item: pytest.Item) -> str:
    """The process group of a test: its module, or for the assignment tests the fixture it
    needs and the assignment it is about."""
    module = item.nodeid.split("::")[0]
    if not module.endswith("test_assignment_grading.py"):
        return module
    params = getattr(getattr(item, "callspec", None), "params", {})
    assignment = "all"
    for name, value in params.items():
        if name == "key":
            assignment = value[0]
        elif name == "variant":
            assignment = value.assignment
        elif name in ("assignment", "graded"):
            assignment = str(getattr(value, "name", value))
    needs = "validate" if "validated" in item.fixturenames else "grade"
    if not {"validated", "graded", "graded_courses"} & set(item.fixturenames):
        return f"{module}-{item.name}"  # a test of its own: any process
    return f"{module}-{needs}-{assignment}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    marked = [item for item in items if item.get_closest_marker("sandbox")]
    if not marked or os.environ.get("CI"):
        return
    from chainrule.grading.sandbox import sandbox_problem

    problem = sandbox_problem()
    if problem:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=problem))
