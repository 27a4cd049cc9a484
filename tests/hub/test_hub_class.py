"""The course for a class, end to end in a real browser, through the class's JupyterHub.

Two students and one instructor log in through JupyterHub's login page. The instructor releases
``check_yourself`` from the formgrader (a hub service); each student fetches it from the
Assignment List, works (the instructor's solutions for one, nothing for the other), validates
and submits; the instructor collects and grades every submission on the task queue from the
formgrader's *Grade on the queue* page (the queue's workers grade ``check_yourself`` in their
sandboxes), regrades one with the formgrader's own Autograde button (which goes through the
queue too), releases the feedback, and each student fetches their own feedback and only theirs.
Then a student tries to read, list or overwrite the other's work, feedback, the release and the
instructor's files, through the exchange and the file system, and is refused.

Screenshots go to ``test-artifacts/hub/``.
"""

from __future__ import annotations

import grp
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from assignment_fixtures import Assignment
from playwright.sync_api import Browser, BrowserContext, Page
from running_class import Classroom

pytestmark = [pytest.mark.hub, pytest.mark.browser, pytest.mark.sandbox, pytest.mark.slow]

ASSIGNMENT = "check_yourself"
NOTEBOOK = "ex1_equal_shards"
TIMEOUT_MS = 240_000
VIEWPORT = {"width": 1400, "height": 900}


class Person:
    """One person's browser context, logged in to the hub."""

    def __init__(self, browser: Browser, hub: Classroom, login: str, artifacts: Path) -> None:
        self.hub = hub
        self.login = login
        self.artifacts = artifacts
        self.context: BrowserContext = browser.new_context(viewport=VIEWPORT)
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.shots = 0

    @property
    def url(self) -> str:
        return self.hub.settings.hub_url

    def record(self, label: str) -> None:
        self.shots += 1
        path = self.artifacts / f"{self.login}__{self.shots:02d}_{label}.png"
        self.page.screenshot(path=str(path), full_page=True)

    def log_in(self) -> None:
        """JupyterHub's login page: name, password, Sign in; wait for the user's JupyterLab."""
        page = self.page
        page.goto(f"{self.url}/hub/login")
        page.locator("#username_input").fill(self.login)
        page.locator("#password_input").fill(self.hub.passwords[self.login])
        self.record("login")
        page.locator("#login_submit").click()
        page.wait_for_url(re.compile(f"/user/{self.login}/lab"), timeout=TIMEOUT_MS)
        page.locator("#jp-main-dock-panel").wait_for()

    def api(self, method: str, path: str, data: object = None) -> object:
        """The user's own Jupyter server's REST API, with the browser's cookies."""
        xsrf = next(c["value"] for c in self.context.cookies() if c["name"] == "_xsrf")
        response = self.context.request.fetch(
            f"{self.url}/user/{self.login}/{path.lstrip('/')}",
            method=method,
            data=json.dumps(data) if data is not None else None,
            headers={"X-XSRFToken": xsrf, "Content-Type": "application/json"},
        )
        assert response.ok, f"{method} {path}: {response.status} {response.text()[:500]}"
        return response.json() if response.text() else None

    def close(self) -> None:
        self.context.close()


def click_menu(page: Page, menu: str, command: str) -> None:
    page.locator(
        "#jp-menu-panel .lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")
    ).click()
    page.locator(f'.lm-Menu li.lm-Menu-item[data-command="{command}"]').click()


def assignment_list(person: Person) -> Page:
    """Nbgrader ▸ Assignment List, loaded."""
    page = person.page
    page.goto(f"{person.url}/user/{person.login}/lab")
    page.locator("#jp-main-dock-panel").wait_for()
    click_menu(page, "Nbgrader", "nbgrader:open-assignment-list")
    page.locator("#released_assignments_list_loading").wait_for(state="hidden")
    return page


def wait_rows(page: Page, name: str, count: int) -> None:
    page.wait_for_function(
        "([s, n]) => document.querySelectorAll(s).length === n",
        arg=[f"#{name}_assignments_list > .list_item", count],
        timeout=TIMEOUT_MS,
    )


def formgrader(person: Person, path: str) -> Page:
    page = person.page
    page.goto(f"{person.url}/services/{person.hub.settings.course_id}/formgrader/{path}")
    return page


def press(person: Person, row_text: str, column: str, label: str) -> str:
    """Press a formgrader table button (``td.<column> a``) in the row naming ``row_text``;
    the log of the success dialog."""
    page = person.page
    row = page.locator("#main-table tr").filter(has_text=row_text).first
    row.locator(f"td.{column} a").click()
    modal = page.locator("#success-modal, #error-modal")
    modal.wait_for(timeout=TIMEOUT_MS)
    person.record(label)
    assert page.locator("#success-modal").count() == 1, modal.inner_text()
    text = modal.locator(".modal-body").inner_text()
    modal.locator(".modal-footer button").first.click()
    modal.wait_for(state="detached")
    return text


def work(person: Person, solved: bool) -> None:
    """Write the instructor's solutions into every fetched notebook (or leave them blank)."""
    if not solved:
        return
    assignment = Assignment(ASSIGNMENT)
    for notebook in assignment.notebooks:
        nb = assignment.build_submission(notebook, written=True)
        path = f"api/contents/{person.hub.settings.course_id}/{ASSIGNMENT}/{notebook}.ipynb"
        person.api("PUT", path, {"type": "notebook", "format": "json", "content": nb})


def validate(person: Person) -> str:
    """Open the first notebook in JupyterLab and press Validate; the dialog's text."""
    page = person.page
    course = person.hub.settings.course_id
    page.goto(f"{person.url}/user/{person.login}/lab/tree/{course}/{ASSIGNMENT}/{NOTEBOOK}.ipynb")
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").wait_for()
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) jp-button.validate-button").click()
    dialog = page.locator(".jp-Dialog").filter(
        has=page.locator(".jp-Dialog-header", has_text="Validation Results")
    )
    dialog.wait_for(timeout=TIMEOUT_MS)
    person.record("validated")
    text = dialog.inner_text()
    dialog.locator("button.jp-Dialog-button").last.click()
    return text


def fetch_and_submit(person: Person, solved: bool) -> str:
    page = assignment_list(person)
    wait_rows(page, "released", 1)
    released = page.locator("#released_assignments_list > .list_item").first
    assert released.locator(".item_name").inner_text().strip() == ASSIGNMENT
    person.record("released")
    released.locator(".item_status button", has_text="Fetch").click()
    wait_rows(page, "fetched", 1)
    work(person, solved)
    verdict = validate(person)
    page = assignment_list(person)
    wait_rows(page, "fetched", 1)
    fetched = page.locator("#fetched_assignments_list > .list_item").first
    fetched.locator(".item_status button", has_text=re.compile("^Submit$")).click()
    wait_rows(page, "submitted", 1)
    person.record("submitted")
    return verdict


def fetch_feedback(person: Person) -> dict[str, str]:
    """Fetch Feedback in the Assignment List; the feedback files the student then has."""
    page = assignment_list(person)
    wait_rows(page, "submitted", 1)
    submitted = page.locator("#submitted_assignments_list > .list_item").first
    submitted.locator("button", has_text="Fetch Feedback").click()
    page.locator(
        "#submitted_assignments_list .list_item a", has_text="view feedback"
    ).first.wait_for()
    person.record("feedback_fetched")
    folder = f"api/contents/{person.hub.settings.course_id}/{ASSIGNMENT}/feedback"
    (stamp,) = person.api("GET", folder)["content"]
    files = person.api("GET", f"{folder}/{stamp['name']}")["content"]
    found = {}
    for entry in files:
        body = person.api("GET", f"{folder}/{stamp['name']}/{entry['name']}?content=1")
        found[entry["name"]] = body["content"]
    page.goto(
        f"{person.url}/user/{person.login}/lab/tree/{person.hub.settings.course_id}/"
        f"{ASSIGNMENT}/feedback/{stamp['name']}/{NOTEBOOK}.html"
    )
    page.locator(".jp-HTMLViewer:not(.lm-mod-hidden) iframe").wait_for()
    page.frame_locator(".jp-HTMLViewer:not(.lm-mod-hidden) iframe").locator("body").wait_for()
    person.record("feedback")
    return found


def scores(classroom: Classroom) -> dict[str, float]:
    from nbgrader.api import Gradebook

    settings = classroom.settings
    with Gradebook(settings.db_url, settings.course_id) as gb:
        return {s.student_id: s.score for s in gb.assignment_submissions(ASSIGNMENT)}


@pytest.fixture(scope="module")
def graded_class(hub: Classroom, browser: Browser, artifacts: Path) -> dict:
    """The whole round trip of the module docstring; what the students received."""
    solver, blank = hub.students
    people = {
        login: Person(browser, hub, login, artifacts) for login in (hub.instructor, solver, blank)
    }
    instructor = people[hub.instructor]
    try:
        for person in people.values():
            person.log_in()
        page = formgrader(instructor, "manage_assignments")
        page.locator("#main-table td.name", has_text=ASSIGNMENT).wait_for()
        instructor.record("formgrader")
        press(instructor, ASSIGNMENT, "release", "released")

        verdicts = {solver: fetch_and_submit(people[solver], True)}
        verdicts[blank] = fetch_and_submit(people[blank], False)

        page = formgrader(instructor, "manage_assignments")
        page.locator("#main-table td.name", has_text=ASSIGNMENT).wait_for()
        press(instructor, ASSIGNMENT, "collect", "collected")
        page = formgrader(instructor, f"manage_submissions/{ASSIGNMENT}")
        page.locator("#grade-on-queue").click()
        page.locator("#start-queue").click()
        # the batch as it runs (a row per student, queued or being graded), then at its end
        page.locator("#queue-counts .label").first.wait_for(timeout=TIMEOUT_MS)
        instructor.record("queue_running")
        page.locator("#queue-time", has_text="finished").wait_for(timeout=600_000)
        instructor.record("queue_done")
        queue_page = {
            "rows": page.locator("#main-table tr").all_inner_texts(),
            "summary": page.locator("#queue-summary").inner_text(),
        }
        after_queue = scores(hub)

        # the formgrader's own Autograde button goes through the queue too
        page = formgrader(instructor, f"manage_submissions/{ASSIGNMENT}")
        page.locator("#main-table td.student-id", has_text=blank).wait_for()
        regrade_log = press(instructor, blank, "autograde", "autograde_button")

        page = formgrader(instructor, "manage_assignments")
        page.locator("#main-table td.name", has_text=ASSIGNMENT).wait_for()
        press(instructor, ASSIGNMENT, "release-feedback", "feedback_released")
        feedback = {login: fetch_feedback(people[login]) for login in (solver, blank)}
        denied = people[solver].context.request.get(
            f"{hub.settings.hub_url}/services/{hub.settings.course_id}/formgrader/manage_assignments",
            max_redirects=5,
        )
        return {
            "verdicts": verdicts,
            "queue_page": queue_page,
            "scores": after_queue,
            "final_scores": scores(hub),
            "regrade_log": regrade_log,
            "feedback": feedback,
            "student_formgrader_status": denied.status,
            "student_formgrader_text": denied.text()[:2000],
        }
    finally:
        for person in people.values():
            person.close()


def test_students_fetch_work_validate_and_submit_through_the_hub(
    hub: Classroom, graded_class: dict
) -> None:
    solver, blank = hub.students
    assert "Success" in graded_class["verdicts"][solver], graded_class["verdicts"][solver]
    assert "Success" not in graded_class["verdicts"][blank]
    assert "NotImplementedError" in graded_class["verdicts"][blank]


def test_the_instructor_grades_every_submission_on_the_queue_from_the_formgrader(
    hub: Classroom, graded_class: dict
) -> None:
    solver, blank = hub.students
    rows = "\n".join(graded_class["queue_page"]["rows"])
    assert solver in rows and blank in rows and "done" in rows, rows
    assert "worker" in rows, rows  # each row names the worker that graded it
    summary = graded_class["queue_page"]["summary"]
    assert "2 submissions, 2 graded" in summary, summary
    scores = graded_class["scores"]
    assert scores[solver] > 0 and scores[blank] == 0, scores
    # the Autograde button regraded on the queue, with the same grade
    assert "on the queue" in graded_class["regrade_log"], graded_class["regrade_log"]
    assert graded_class["final_scores"] == scores


def test_each_student_gets_only_their_own_feedback(hub: Classroom, graded_class: dict) -> None:
    solver, blank = hub.students
    feedback = graded_class["feedback"]
    notebooks = {f"{name}.html" for name in Assignment(ASSIGNMENT).notebooks}
    for login in (solver, blank):
        assert set(feedback[login]) == notebooks
    solved, empty = feedback[solver][f"{NOTEBOOK}.html"], feedback[blank][f"{NOTEBOOK}.html"]
    assert score_of(solved) > 0 and score_of(empty) == 0, (score_of(solved), score_of(empty))
    assert "NotImplementedError" in empty and "NotImplementedError" not in solved
    assert "BEGIN HIDDEN TESTS" not in solved + empty


def score_of(feedback_html: str) -> float:
    """The notebook's score in its feedback page ("(Score: 3.0 / 5.0)")."""
    match = re.search(r"\(Score: ([0-9.]+) / [0-9.]+\)", feedback_html)
    assert match, feedback_html[:2000]
    return float(match.group(1))


def test_students_cannot_open_the_formgrader(hub: Classroom, graded_class: dict) -> None:
    assert graded_class["student_formgrader_status"] == 403, graded_class["student_formgrader_text"]


TRIES = textwrap.dedent(
    """
    import json, os, sys
    tries = json.loads(sys.argv[1])
    results = {}
    for name, (action, path) in tries.items():
        try:
            if action == "list":
                os.listdir(path)
            elif action == "read":
                open(path, "rb").read()
            elif action == "write":
                open(path, "ab").write(b"x")
            elif action == "create":
                open(path, "xb").close()
            elif action == "rename":
                os.rename(path, path + ".moved")
            elif action == "remove":
                os.remove(path) if os.path.isfile(path) else os.rmdir(path)
            results[name] = "allowed"
        except OSError as error:
            results[name] = type(error).__name__
    print(json.dumps(results))
    """
)


def as_student(hub: Classroom, login: str, args: list[str]) -> subprocess.CompletedProcess:
    home = hub.settings.homes / login
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "USER": login,
        "JUPYTER_CONFIG_PATH": str(hub.settings.jupyter_config),
        "NBGRADER_EXCHANGE": str(hub.settings.exchange),
    }
    return subprocess.run(
        [shutil.which("runuser") or "/usr/sbin/runuser", "-u", login, "--", *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_student_cannot_read_list_or_overwrite_another_s_work(
    hub: Classroom, graded_class: dict
) -> None:
    solver, intruder = hub.students
    settings = hub.settings
    course = settings.exchange / settings.course_id
    (submission,) = [p for p in (course / "inbound").iterdir() if p.name.startswith(f"{solver}+")]
    feedback_file = next((course / "feedback").iterdir())
    release = course / "outbound" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    tries = {
        "list inbound": ("list", str(course / "inbound")),
        "list the submission": ("list", str(submission)),
        "read the submission": ("read", str(submission / f"{NOTEBOOK}.ipynb")),
        "read its secret": ("read", str(submission / "submission_secret.txt")),
        "change the submission": ("write", str(submission / f"{NOTEBOOK}.ipynb")),
        "add to the submission": ("create", str(submission / "extra.py")),
        "move the submission": ("rename", str(submission)),
        "list the feedback": ("list", str(course / "feedback")),
        "remove a feedback file": ("remove", str(feedback_file)),
        "overwrite the release": ("write", str(release)),
        "add to the release": ("create", str(release.parent / "extra.ipynb")),
        "move the course's exchange": ("rename", str(course)),
        "read the other's home": ("list", str(settings.homes / solver)),
        "read the other's fetched work": (
            "read",
            str(settings.homes / solver / settings.course_id / ASSIGNMENT / f"{NOTEBOOK}.ipynb"),
        ),
        "read the other's feedback copy": (
            "list",
            str(settings.homes / solver / settings.course_id / ASSIGNMENT / "feedback"),
        ),
        "read the instructor's source": (
            "read",
            str(settings.course_dir / "source" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"),
        ),
        "list the collected submissions": ("list", str(settings.course_dir / "submitted")),
        "read the class's passwords": ("read", str(settings.path)),
    }
    result = as_student(hub, intruder, [sys.executable, "-c", TRIES, json.dumps(tries)])
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)
    allowed = [name for name, outcome in outcomes.items() if outcome == "allowed"]
    assert not allowed, outcomes
    # the release itself is readable (students fetch it), so the refusals above are the modes'
    sanity = as_student(hub, intruder, [sys.executable, "-c", f"open({str(release)!r}).read()"])
    assert sanity.returncode == 0, sanity.stderr

    # through nbgrader's exchange: no listing of others' submissions, no feedback of theirs
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    listing = as_student(hub, intruder, [nbgrader, "list", "--inbound"])
    assert solver not in listing.stdout + listing.stderr, listing.stdout + listing.stderr
    stolen = as_student(
        hub, intruder, [nbgrader, "fetch_feedback", ASSIGNMENT, f"--student={solver}"]
    )
    # nbgrader finds feedback by the secrets of the caller's own submissions: what came is the
    # intruder's own feedback again (a blank submission: 0 points), nothing of the solver's
    assert stolen.returncode == 0, stolen.stderr
    folder = settings.homes / intruder / settings.course_id / ASSIGNMENT / "feedback"
    copies = list(folder.rglob("*.html"))
    assert copies
    for copy in copies:
        assert score_of(copy.read_text()) == 0, copy
    # the submitted copy in the exchange is the owner's and the graders' only
    assert (submission.stat().st_mode & 0o007) == 0
    assert submission.stat().st_gid == grp.getgrnam(settings.formgrade_group).gr_gid
    nb = nbformat.read(submission / f"{NOTEBOOK}.ipynb", 4)
    assert nb.cells
