"""Tests that grade with the batch grader need its sandbox (bubblewrap); ``make test`` runs the
suite on ``TEST_PROCESSES`` processes (pytest-xdist, 3 unless the Makefile is told otherwise).

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
from collections.abc import Iterator
from typing import Any

import pytest

#: Folders whose tests share session fixtures, so run in one process.
SHARED_FOLDERS = ("tests/browser/", "tests/hub/")
#: The longest groups, handed out first so that no process is left with one at the end.
LONGEST = (
    "tests/test_assignment_grading.py",
    "tests/test_exercise_fixtures.py",
    "tests/browser/",
    "tests/hub/",
    "tests/test_grading_adversarial.py",
)


def process_group(nodeid: str) -> str:
    """The group of a test (by its node id): its shared folder, else its module."""
    module = nodeid.split("::")[0]
    return next((folder for folder in SHARED_FOLDERS if module.startswith(folder)), module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduling by scope, with :func:`process_group` as the scope and the
    longest groups first."""
    from xdist.scheduler import LoadScopeScheduling

    class ProcessGroups(LoadScopeScheduling):  # type: ignore[misc]
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return process_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:
                for group in reversed(LONGEST):
                    if group in self.workqueue:
                        self.workqueue.move_to_end(group, last=False)
                self.ordered = True
            super()._assign_work_unit(node)

    return ProcessGroups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("sandbox")]
    if not marked or os.environ.get("CI"):
        return
    from chainrule.grading.sandbox import sandbox_problem

    problem = sandbox_problem()
    if problem:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=problem))


@pytest.fixture(scope="session")
def playwright() -> Iterator[Any]:
    """Playwright's synchronous API, started once per test process: the browser tests and
    the class deployment's tests (which may share a process) each launch their browser from
    it (a second start in one process fails: its event loop is already running)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as started:
        yield started
