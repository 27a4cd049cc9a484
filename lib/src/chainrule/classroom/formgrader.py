"""The formgrader of a class grades on the task queue (a Jupyter server extension).

Loaded in the formgrader service next to nbgrader's own formgrader (``jupyter-graders/`` of the
class's folder enables it), before it, so that its routes come first:

- the formgrader's **Autograde** button of a submission (``POST
  /formgrader/api/submission/<assignment>/<student>/autograde``) sends that submission to the
  queue and answers when a worker has graded it, with nbgrader's answer format; the server
  keeps serving other requests meanwhile (nbgrader's own button blocks the whole server);
- **Grade on the queue** (``/formgrader/queue/<assignment>``, linked from *Manage
  Submissions*): one button grades every submission, and the page shows the batch as it runs:
  each student waiting, being graded (by which worker, which attempt) or done with its status,
  the time elapsed and an estimate of the time left; at the end the summary, and links to
  nbgrader's CSV export and the LMS grades file.

A batch (or one submission) is graded at a time per course; a second request is refused with a
message saying so.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader
from jupyter_server.serverapp import ServerApp
from nbgrader.server_extensions.formgrader import handlers as nbgrader_handlers
from nbgrader.server_extensions.formgrader.base import (
    BaseApiHandler,
    BaseHandler,
    check_notebook_dir,
    check_xsrf,
)
from tornado import web

from chainrule.classroom.progress import BatchProgress
from chainrule.classroom.settings import ClassSettings

TEMPLATES = Path(__file__).with_name("templates")


class QueueState:
    """The course's one running (or last) batch, per assignment, and the lock that keeps a
    second from starting."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: dict[str, BatchProgress] = {}
        self.logs: dict[str, io.StringIO] = {}
        self._app: Any = None

    def app(self, course_root: str) -> Any:
        """The course's Celery application (made once)."""
        if self._app is None:
            from chainrule.classroom.__main__ import app_for

            self._app = app_for(ClassSettings.read(), Path(course_root))
        return self._app


STATE = QueueState()


def grade(course_root: str, assignment: str, students: list[str]) -> tuple[bool, str]:
    """Grade on the queue (the calling thread waits); whether every notebook was graded, and
    the log. Refused while another batch of the course runs."""
    from chainrule.classroom.dispatch import grade_on_queue
    from chainrule.grading.queue import BatchOptions

    if not STATE.lock.acquire(blocking=False):
        return False, "A batch is being graded on the queue; try again when it has finished."
    log = io.StringIO()
    try:
        STATE.logs[assignment] = log
        options = BatchOptions(
            assignment=assignment, course_root=Path(course_root), students=students
        )

        def started(progress: BatchProgress) -> None:
            STATE.batches[assignment] = progress

        result = grade_on_queue(STATE.app(course_root), options, stream=log, on_start=started)
        return result.all_graded, log.getvalue()
    except Exception as error:  # the page and the button show it
        return False, f"{log.getvalue()}\n{type(error).__name__}: {error}"
    finally:
        STATE.lock.release()


class QueuedAutogradeHandler(BaseApiHandler):
    """The formgrader's Autograde button, through the queue."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    async def post(self, assignment_id: str, student_id: str) -> None:
        ok, log = await asyncio.to_thread(grade, self.coursedir.root, assignment_id, [student_id])
        answer = {"success": ok, "log": log}
        if not ok:
            answer["error"] = log
        self.write(json.dumps(answer))


class QueueApiHandler(BaseApiHandler):
    """``GET``: the assignment's batch as it runs; ``POST``: grade every submission."""

    @web.authenticated
    @check_xsrf
    def get(self, assignment_id: str) -> None:
        progress = STATE.batches.get(assignment_id)
        answer = progress.to_json() if progress else {"assignment": assignment_id, "total": 0}
        answer["running"] = STATE.lock.locked()
        log = STATE.logs.get(assignment_id)
        answer["log"] = log.getvalue()[-20000:] if log else ""
        self.write(json.dumps(answer))

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def post(self, assignment_id: str) -> None:
        if STATE.lock.locked():
            raise web.HTTPError(409, "a batch is being graded on the queue")
        root = self.coursedir.root
        threading.Thread(target=grade, args=(root, assignment_id, []), daemon=True).start()
        self.write(json.dumps({"started": True}))


def templates() -> Environment:
    """This extension's templates, which extend nbgrader's (as ``nbgrader/<name>``)."""
    theirs = FileSystemLoader([nbgrader_handlers.template_path])
    loader = ChoiceLoader(
        [FileSystemLoader([str(TEMPLATES)]), PrefixLoader({"nbgrader": theirs}), theirs]
    )
    return Environment(loader=loader)


class QueuePageHandler(BaseHandler):
    """The page *Grade on the queue* of an assignment."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def get(self, assignment_id: str) -> None:
        page = templates().get_template("queue.tpl")
        self.write(page.render(base_url=self.base_url, assignment_id=assignment_id))


class ManageSubmissionsHandler(BaseHandler):
    """nbgrader's *Manage Submissions*, with a link to *Grade on the queue*."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    def get(self, assignment_id: str) -> None:
        page = templates().get_template("manage_submissions.tpl")
        self.write(
            page.render(
                course_dir=self.coursedir.root, assignment_id=assignment_id, base_url=self.base_url
            )
        )


HANDLERS = [
    (r"/formgrader/api/submission/([^/]+)/([^/]+)/autograde", QueuedAutogradeHandler),
    (r"/formgrader/api/queue/([^/]+)", QueueApiHandler),
    (r"/formgrader/queue/([^/]+)/?", QueuePageHandler),
    (r"/formgrader/manage_submissions/([^/]+)/?", ManageSubmissionsHandler),
]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "chainrule.classroom.formgrader"}]


def _load_jupyter_server_extension(serverapp: ServerApp) -> None:
    """Add the routes (before nbgrader's formgrader adds its own, so these win)."""
    from jupyter_server.utils import url_path_join

    base = serverapp.web_app.settings["base_url"]
    handlers = [(url_path_join(base, pattern.lstrip("/")), cls) for pattern, cls in HANDLERS]
    serverapp.web_app.add_handlers(".*$", handlers)
    serverapp.log.info("The formgrader grades on the task queue (chainrule.classroom)")
