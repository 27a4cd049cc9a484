"""The student's Assignment List (Nbgrader ▸ Assignment List) fetches and submits.

The instructor has generated and released ``check_yourself`` into the temporary exchange; the
student fetches it from the list, then submits it, and the instructor's side sees the
submission in the exchange's inbound folder and in ``nbgrader list --inbound``.
"""

from __future__ import annotations

import getpass
import re
from pathlib import Path

import pytest
from lab_page import LabPage
from lab_server import LabServer
from playwright.sync_api import Locator

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COURSE_ID = "autograd-distributed"
LIST_TIMEOUT_MS = 120_000


def loaded_rows(lab: LabPage, name: str, count: int) -> Locator:
    """The rows of the 'released', 'fetched' or 'submitted' list, once it shows ``count``."""
    for part in ("loading", "placeholder", "error"):
        lab.page.locator(f"#{name}_assignments_list_{part}").wait_for(
            state="hidden", timeout=LIST_TIMEOUT_MS
        )
    rows = lab.page.locator(f"#{name}_assignments_list > .list_item")
    lab.page.wait_for_function(
        "([selector, n]) => document.querySelectorAll(selector).length === n",
        arg=[f"#{name}_assignments_list > .list_item", count],
        timeout=LIST_TIMEOUT_MS,
    )
    return rows


def notebook_names(folder: Path) -> set[str]:
    """Names of the notebooks directly in ``folder``."""
    return {path.name for path in folder.glob("*.ipynb")}


def test_student_fetches_and_submits_from_the_assignment_list(
    lab: LabPage, lab_server: LabServer, released_assignment: str
) -> None:
    released_notebooks = notebook_names(lab_server.root / "release" / released_assignment)
    assert released_notebooks, "the release has no notebooks"

    lab.goto("")
    lab.open_nbgrader_panel("nbgrader:open-assignment-list", "Assignments")
    released = loaded_rows(lab, "released", 1).first
    assert released.locator(".item_name").inner_text().strip() == released_assignment
    assert released.locator(".item_course").inner_text().strip() == COURSE_ID
    lab.record("released")

    released.locator(".item_status button", has_text="Fetch").click()
    fetched = loaded_rows(lab, "fetched", 1).first
    assert fetched.locator(".item_name").first.inner_text().strip() == released_assignment
    fetched_folder = lab_server.root / COURSE_ID / released_assignment
    assert notebook_names(fetched_folder) == released_notebooks
    lab.record("fetched")

    fetched.locator(".item_status button", has_text=re.compile("^Submit$")).click()
    submitted = loaded_rows(lab, "submitted", 1).first
    assert submitted.locator(".item_name").first.inner_text().strip() == released_assignment
    lab.record("submitted")

    student = getpass.getuser()
    inbound = lab_server.exchange / COURSE_ID / "inbound"
    submissions = [
        p for p in inbound.iterdir() if p.name.startswith(f"{student}+{released_assignment}+")
    ]
    assert len(submissions) == 1, sorted(p.name for p in inbound.iterdir())
    assert notebook_names(submissions[0]) == released_notebooks

    listing = lab_server.run("nbgrader", "list", "--inbound")
    assert listing.returncode == 0, listing.stderr
    lines = (listing.stdout + listing.stderr).splitlines()
    assert any(
        COURSE_ID in line and student in line and released_assignment in line for line in lines
    ), "\n".join(lines)
