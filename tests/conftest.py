"""How the suite is collected.

Tests that grade with the batch grader need its sandbox (bubblewrap): tests marked ``sandbox``
are skipped where bubblewrap cannot run (with the reason), except in CI (``CI`` set), where
``.ci/run`` installs it and its absence is a failure.

``make test`` runs the suite on two pytest-xdist workers (``--dist loadgroup``). Each module's
tests go to one worker, so that its module-scoped fixtures (a graded class, a running
JupyterLab) are made once; the browser tests share one group (one JupyterLab), and the
assignment tests make one group per assignment, so that the two assignments are graded at the
same time.
"""

from __future__ import annotations

import os

import pytest


def _group(item: pytest.Item) -> str:
    module = item.nodeid.split("::")[0]
    if module.startswith("tests/browser/"):
        return "tests/browser"
    if not module.startswith("tests/test_assignment_"):
        return module
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name, value in params.items():
        if name == "key" and isinstance(value, tuple):
            value = value[0]
        assignment = getattr(value, "assignment", None) or getattr(value, "name", None) or value
        if name in ("key", "variant", "assignment", "graded") and isinstance(assignment, str):
            return f"{module}@{assignment}"
    return module


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
