"""Tests that grade with the batch grader need its sandbox (bubblewrap).

Tests marked ``sandbox`` are skipped where bubblewrap cannot run (with the reason), except in CI
(``CI`` set), where ``.ci/run`` installs it and its absence is a failure.
"""

from __future__ import annotations

import os

import pytest


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
