"""The instructor's Formgrader (Nbgrader ▸ Formgrader) lists the generated assignment and shows a
submission with its LaTeX typeset by a MathJax the Jupyter server serves itself."""

from __future__ import annotations

import re
import shutil

import pytest
from lab_page import LabPage
from lab_server import LabServer
from playwright.sync_api import Route

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


def test_a_submission_in_the_formgrader_typesets_its_latex_without_a_cdn(
    lab: LabPage, lab_server: LabServer, released_assignment: str
) -> None:
    """One autograded submission opened in the formgrader, with every request to a CDN refused
    (as offline): MathJax comes from the Jupyter server and typesets the notebook's LaTeX."""
    notebook = "ex1_equal_shards"
    submitted = lab_server.root / "submitted" / "ada" / released_assignment
    submitted.mkdir(parents=True, exist_ok=True)
    shutil.copy(lab_server.root / "release" / released_assignment / f"{notebook}.ipynb", submitted)
    result = lab_server.run("nbgrader", "autograde", released_assignment, "--student", "ada")
    assert result.returncode == 0, result.stdout + result.stderr
    (submission,) = lab_server.api(
        "GET", f"/formgrader/api/submitted_notebooks/{released_assignment}/{notebook}"
    )

    refused: list[str] = []

    def refuse(route: Route) -> None:
        refused.append(route.request.url)
        route.abort()

    lab.page.route(re.compile(r"^https?://(?!127\.0\.0\.1)"), refuse)
    lab.page.goto(lab_server.url(f"/formgrader/submissions/{submission['id']}/"))
    lab.page.wait_for_function(
        "() => window.MathJax && window.MathJax.Hub && MathJax.Hub.queue.pending === 0"
        " && document.querySelectorAll('.MathJax, .MathJax_CHTML').length > 0",
        timeout=60_000,
    )
    typeset = lab.page.locator(".MathJax, .MathJax_CHTML").count()
    assert typeset > 0 and refused == [], (typeset, refused)
    lab.record("formgrade_latex")
