"""The instructor's Formgrader (Nbgrader ▸ Formgrader) lists the generated assignment and shows a
submission with its LaTeX typeset by a MathJax the Jupyter server serves itself (fonts too); its
Autograde and Generate Feedback buttons warn about nothing an honest student did and name the
students; the feedback typesets its LaTeX in JupyterLab, offline."""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest
from lab_page import LabPage
from lab_server import LabServer
from playwright.sync_api import Page, Route

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

    lab.goto("")  # JupyterLab logs the browser in: the formgrader's own requests carry no token
    seen = track_requests(lab.page)
    lab.page.goto(lab_server.url(f"/formgrader/submissions/{submission['id']}/"))
    lab.page.wait_for_function(_TYPESET_DONE_JS, timeout=60_000)
    lab.page.wait_for_function("() => document.fonts.status === 'loaded'")
    assert_typeset_offline(lab.page.evaluate(_TYPESET_JS), seen)
    lab.record("formgrade_latex")


# -- what the instructor and the student see of a graded submission ------------------------------

NOTEBOOK = "ex1_equal_shards"
#: A visible line of a test cell of NOTEBOOK, and what a student who edits the test makes of it.
TEST_CELL = "test_equal_shards"
TEST_LINE = "rng = np.random.default_rng(11)"
EDITED_LINE = "rng = np.random.default_rng(12)"
TIMESTAMP = "2026-12-01 10:00:00.000000 UTC"


def track_requests(page: Page) -> dict[str, list[str]]:
    """What a page asks for that it should not: answers of 400 and above, requests that fail
    (a font that CORS blocks, say) and requests that leave this machine (refused, as offline).
    Not counted: ``about:blank``, MathJax's own font probe, and requests aborted because the
    page moved on (JupyterLab's polling, when the test leaves it)."""
    seen: dict[str, list[str]] = {"failed": [], "outside": []}
    page.on(
        "response",
        lambda response: (
            seen["failed"].append(f"{response.status} {response.url}")
            if response.status >= 400
            else None
        ),
    )
    page.on(
        "requestfailed",
        lambda request: (
            seen["failed"].append(f"{request.failure} {request.url}")
            if request.url != "about:blank" and request.failure != "net::ERR_ABORTED"
            else None
        ),
    )

    def refuse(route: Route) -> None:
        seen["outside"].append(route.request.url)
        route.abort()

    page.route(re.compile(r"^https?://(?!127\.0\.0\.1)"), refuse)
    return seen


#: Run in a page (or frame) that MathJax typeset: how many formulas, the faces of STIX-Web it
#: loaded, the faces that failed (but MathJax_Blank, its probe), and the font of ∇'s variable.
_TYPESET_JS = """() => {
  const faces = [];
  document.fonts.forEach(face => faces.push([face.family, face.status]));
  return {
    formulas: document.querySelectorAll('.MathJax').length,
    stix_loaded: faces.filter(([f, s]) => f.startsWith('STIXMathJax') && s === 'loaded')
                      .map(([f]) => f),
    failed: faces.filter(([f, s]) => s === 'error' && f !== 'MathJax_Blank').map(([f]) => f),
  };
}"""
_TYPESET_DONE_JS = (
    "() => window.MathJax && MathJax.Hub && MathJax.Hub.queue && MathJax.Hub.queue.pending === 0"
    " && document.querySelectorAll('.MathJax').length > 0"
)


def assert_typeset_offline(typeset: dict, seen: dict[str, list[str]]) -> None:
    """LaTeX typeset by the server's MathJax in its STIX-Web fonts: italic variables (the
    Normal-italic face), \\mathcal B (Variants-italic), nothing missing, no CDN."""
    assert typeset["formulas"] > 10, typeset
    for face in ("STIXMathJax_Main", "STIXMathJax_Normal-italic", "STIXMathJax_Variants-italic"):
        assert face in typeset["stix_loaded"], typeset
    assert typeset["failed"] == [], typeset
    assert seen == {"failed": [], "outside": []}, seen


def submit_copy(lab_server: LabServer, assignment: str, student: str, edit_test: bool) -> None:
    """``submitted/<student>/<assignment>/`` as ``nbgrader collect`` leaves it: the released
    notebook, untouched or with a visible line of a test cell changed, and a timestamp."""
    released = lab_server.root / "release" / assignment / f"{NOTEBOOK}.ipynb"
    nb = nbformat.read(released, 4)
    if edit_test:
        (cell,) = [
            c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == TEST_CELL
        ]
        assert TEST_LINE in cell.source
        cell.source = cell.source.replace(TEST_LINE, EDITED_LINE)
    folder = lab_server.root / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{NOTEBOOK}.ipynb")
    (folder / "timestamp.txt").write_text(TIMESTAMP)


def press_in_row(lab: LabPage, student: str, column: str) -> str:
    """Press a student's button in the formgrader's Manage Submissions table (``autograde``,
    ``generate-feedback``); the log its success dialog shows, once it is recorded."""
    page = lab.page
    row = page.locator("#main-table tr").filter(
        has=page.locator("td.student-id", has_text=re.compile(f"^{re.escape(student)}$"))
    )
    row.locator(f"td.{column} a").click()
    modal = page.locator("#success-modal")
    modal.wait_for(timeout=300_000)
    log = modal.locator(".modal-body pre").inner_text()
    lab.record(f"{column}_{student}")
    modal.locator(".modal-footer button").click()
    modal.wait_for(state="detached")
    return log


def test_the_formgrader_warns_only_about_test_cells_a_student_changed_and_names_students(
    lab: LabPage, lab_server: LabServer, released_assignment: str
) -> None:
    """Autograde and feedback from the formgrader's buttons. An untouched submission's test
    cells differ from the instructor's only by the hidden tests: no checksum warning; a
    changed test line is still reported. The students autograde adds are named (not "None,
    None"), and generating feedback logs no configuration warning."""
    for student, edit_test in (("honest", False), ("tamperer", True)):
        submit_copy(lab_server, released_assignment, student, edit_test)
    page = lab.page
    lab.goto("")  # JupyterLab logs the browser in: the formgrader's own requests carry no token
    page.goto(lab_server.url(f"/formgrader/manage_submissions/{released_assignment}"))
    page.locator("#main-table td.student-id", has_text="tamperer").wait_for()
    logs = {student: press_in_row(lab, student, "autograde") for student in ("honest", "tamperer")}
    assert "checksum" not in logs["honest"], logs["honest"]
    assert f"Attribute 'checksum' for cell {TEST_CELL} has changed" in logs["tamperer"], logs
    # the other test cell is as released: only the edited one is reported
    assert logs["tamperer"].count("checksum") == 1, logs["tamperer"]

    feedback_log = press_in_row(lab, "honest", "generate-feedback")
    assert "WARNING" not in feedback_log and "not recognized" not in feedback_log, feedback_log

    for student in ("honest", "tamperer"):
        name = (
            page.locator("#main-table tr")
            .filter(has=page.locator("td.student-id", has_text=re.compile(f"^{student}$")))
            .locator("td.student-name")
        )
        assert name.inner_text().strip() == f"{student},", name.inner_text()
    page.goto(lab_server.url("/formgrader/manage_students"))
    names = page.locator("#main-table td.name")
    names.first.wait_for()
    shown = [text.strip() for text in names.all_inner_texts()]
    assert "honest," in shown and not any("None" in text for text in shown), shown
    lab.record("manage_students")


def test_feedback_typesets_its_latex_in_jupyterlab_without_a_cdn(
    lab: LabPage, lab_server: LabServer, released_assignment: str
) -> None:
    """The feedback file opened in JupyterLab's HTML viewer, offline. Untrusted, the viewer runs
    no script: the page says how to typeset it. Trusted, the page finds the Jupyter server
    from its own address and typesets with the server's MathJax and fonts."""
    student = "reader"
    submit_copy(lab_server, released_assignment, student, edit_test=False)
    for command in ("autograde", "generate_feedback"):
        result = lab_server.run("nbgrader", command, released_assignment, "--student", student)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "not recognized" not in result.stderr, result.stderr
    path = f"feedback/{student}/{released_assignment}/{NOTEBOOK}.html"
    assert (lab_server.root / path).is_file()
    seen = track_requests(lab.page)
    lab.goto(path)
    viewer = lab.page.locator(".jp-HTMLViewer:not(.lm-mod-hidden)")
    frame = viewer.frame_locator("iframe")
    frame.locator("body").wait_for()
    note = frame.locator("body").evaluate("b => getComputedStyle(b, '::before').content")
    assert "Trust HTML" in note, note
    lab.record("feedback_untrusted")

    toolbar = lab.page.locator(
        "#jp-main-dock-panel .lm-DockPanel-widget:not(.lm-mod-hidden) .jp-Toolbar"
    )
    toolbar.locator("jp-button, button", has_text="Trust HTML").first.click()
    content = viewer.locator("iframe").element_handle().content_frame()
    content.wait_for_function(_TYPESET_DONE_JS, timeout=60_000)
    content.wait_for_function("() => document.fonts.status === 'loaded'")
    assert content.evaluate("() => document.baseURI").startswith(lab_server.base_url + "/files/")
    assert_typeset_offline(content.evaluate(_TYPESET_JS), seen)
    lab.record("feedback_trusted")
