"""The instructor's Formgrader (Nbgrader ▸ Formgrader) lists the generated assignment."""

from __future__ import annotations

import re

import pytest
from lab_page import LabPage

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_formgrader_lists_the_released_assignment(lab: LabPage, released_assignment: str) -> None:
    lab.goto("")
    lab.open_nbgrader_panel("nbgrader:open-formgrader", "Formgrader")
    frame = lab.formgrader_frame()
    name_cell = frame.locator(
        "td.name", has_text=re.compile(f"^\\s*{re.escape(released_assignment)}\\s*$")
    )
    name_cell.wait_for()
    row = frame.locator("tr", has=name_cell)
    assert row.locator("td.status").inner_text().strip() == "released"
    lab.record("formgrader")
