"""Before the instructor releases anything, the student's Assignment List says so.

On a fresh clone the exchange folder does not exist yet; nbgrader_config.py makes it, so the
list shows "There are no assignments to fetch." instead of "Error fetching courses!". This test
runs before any test releases the assignment (see ``conftest.py``).
"""

from __future__ import annotations

import pytest
from lab_page import LabPage
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUNS_BEFORE_RELEASE = True
LIST_TIMEOUT_MS = 120_000


def test_the_assignment_list_says_nothing_is_released_yet(
    lab: LabPage, lab_server: LabServer
) -> None:
    outbound = lab_server.exchange / "autograd-distributed" / "outbound"
    assert not outbound.exists(), "an assignment was released before this test"
    lab.goto("")
    panel = lab.open_nbgrader_panel("nbgrader:open-assignment-list", "Assignments")
    for name in ("released", "fetched", "submitted"):
        lab.page.locator(f"#{name}_assignments_list_loading").wait_for(
            state="hidden", timeout=LIST_TIMEOUT_MS
        )
    placeholder = lab.page.locator("#released_assignments_list_placeholder")
    placeholder.wait_for(timeout=LIST_TIMEOUT_MS)
    assert "There are no assignments to fetch." in placeholder.inner_text()
    text = panel.inner_text()
    assert "Error" not in text, text
    for name in ("released", "fetched", "submitted"):
        assert not lab.page.locator(f"#{name}_assignments_list_error").is_visible()
    lab.record("assignment_list_before_release")
