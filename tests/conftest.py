"""Tests that grade with the batch grader need its sandbox (bubblewrap); ``make test`` runs the
suite on ``TEST_PROCESSES`` processes (pytest-xdist, 3 unless the Makefile is told otherwise).

Tests marked ``sandbox`` are skipped where bubblewrap cannot run (with the reason), except in CI
(``CI`` set), where ``.ci/run`` installs it and its absence is a failure.

Each test runs in the process of its group: its module, so that a module's fixtures (a graded
class, a validated class) are made once; the browser tests, which share one JupyterLab server
and one release of the assignment in a set order; the class deployment's tests, which share one
hub, database and broker; and the assignment tests, whose session fixtures (every assignment
graded end to end, every fixture judged in-process) are made once per assignment: each
assignment's tests of both modules run in one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

#: Folders whose tests share session fixtures, so run in one process.
SHARED_FOLDERS = ("tests/browser/", "tests/hub/")
#: Modules whose tests of one assignment share its session fixtures (its graded class, every
#: fixture's in-process verdicts): each assignment's tests of both run in one process.
BY_ASSIGNMENT = ("tests/test_assignment_grading.py", "tests/test_exercise_fixtures.py")
#: The longest groups, handed out first so that no process is left with one at the end.
LONGEST = (
    "assignment training",
    "tests/browser/",
    "assignment pipeline",
    "tests/hub/",
    "assignment check_yourself",
    "tests/test_grading_adversarial.py",
    "assignment sharded",
)


def process_group(nodeid: str) -> str:
    """The group of a test (by its node id): its shared folder; for the modules of
    :data:`BY_ASSIGNMENT`, its assignment (the first part of its parameters' id); else its
    module."""
    from assignment_fixtures import BY_NAME

    module = nodeid.split("::")[0]
    if module in BY_ASSIGNMENT and "[" in nodeid:
        name = nodeid.split("[", 1)[1].rstrip("]").split("-")[0]
        if name in BY_NAME:
            return f"assignment {name}"
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
def judged(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every fixture's verdicts, judged in-process once per assignment for the session
    (:class:`judged_in_process.Verdicts`): ``judged[(assignment, notebook, name, mode)]``,
    read by ``test_exercise_fixtures`` and ``test_assignment_grading``."""
    from judged_in_process import Verdicts

    return Verdicts(tmp_path_factory)


@pytest.fixture(scope="session")
def playwright() -> Iterator[Any]:
    """Playwright's synchronous API, started once per test process: the browser tests and
    the class deployment's tests (which may share a process) each launch their browser from
    it (a second start in one process fails: its event loop is already running)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as started:
        yield started
