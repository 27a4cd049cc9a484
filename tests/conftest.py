"""Tests that grade with the batch grader need its sandbox (bubblewrap); ``make test`` runs the
suite on two processes (pytest-xdist, ``--dist loadgroup``).

Tests marked ``sandbox`` are skipped where bubblewrap cannot run (with the reason), except in CI
(``CI`` set), where ``.ci/run`` installs it and its absence is a failure.

Each test runs in the process of its group: its module, so that a module's fixtures (a graded
class, a validated class) are made once; the browser tests, which share one JupyterLab server
and one release of the assignment in a set order; the class deployment's tests, which share one
hub, database and broker; and the assignment tests, whose session fixtures (every assignment
graded end to end, every fixture judged) serve the whole module.
"""

from __future__ import annotations

import os

import pytest

#: Folders whose tests share session fixtures, so run in one process.
SHARED_FOLDERS = ("tests/browser/", "tests/hub/")


def process_group(nodeid: str) -> str:
    """The group of a test (by its node id): its shared folder, else its module."""
    module = nodeid.split("::")[0]
    return next((folder for folder in SHARED_FOLDERS if module.startswith(folder)), module)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(process_group(item.nodeid)))
    marked = [item for item in items if item.get_closest_marker("sandbox")]
    if not marked or os.environ.get("CI"):
        return
    from chainrule.grading.sandbox import sandbox_problem

    problem = sandbox_problem()
    if problem:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=problem))
