"""Setting a class up again after a crash: what the last run left running under the course's
accounts is stopped first, and an account that runs a process is not changed where nothing
changes (``usermod`` refuses to move the home of a busy account)."""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from chainrule.classroom import accounts
from chainrule.classroom.deploy import SINGLE_USER, stop_leftovers
from chainrule.classroom.settings import ClassSettings, Roster

pytestmark = [
    pytest.mark.hub,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the class's accounts)"),
]


def run_as(login: str, *argv: str) -> subprocess.Popen:
    """A process of ``login`` whose command line is ``argv`` (Python sleeping)."""
    entry = pwd.getpwnam(login)
    code = "import time; time.sleep(120)"
    return subprocess.Popen(
        ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
        + [sys.executable, "-c", code, *argv]
    )


@pytest.fixture
def course(tmp_path: Path) -> Iterator[tuple[ClassSettings, Roster]]:
    tag = secrets.token_hex(2)
    settings = ClassSettings(root=tmp_path, course_id=f"leftover{tag}")
    roster = Roster({f"lo{tag}i": "Grace Hopper"}, {f"lo{tag}a": "Ada Lovelace"})
    logins = [settings.grader_account, *roster.instructors, *roster.students]
    for login in logins:
        accounts.ensure_account(login, login, tmp_path / login, [])
    yield settings, roster
    for login in logins:
        accounts.remove_account(login)


def test_a_leftover_server_is_stopped_and_nothing_else_of_a_person(course) -> None:  # noqa: ANN001
    settings, roster = course
    (student,) = roster.students
    server = run_as(student, SINGLE_USER, "--port=1")
    own_work = run_as(student, "a shell of the student's own")
    grader = run_as(settings.grader_account, "formgrader")
    try:
        stopped = stop_leftovers(settings, roster)
        assert sorted(stopped) == sorted([student, settings.grader_account])
        assert server.wait(timeout=10) is not None
        assert grader.wait(timeout=10) is not None
        assert own_work.poll() is None
    finally:
        for process in (server, own_work, grader):
            process.kill()
            process.wait()


def test_an_unchanged_account_is_left_alone_while_it_runs_a_process(course, tmp_path) -> None:  # noqa: ANN001
    settings, roster = course
    (student,) = roster.students
    busy = run_as(student, "busy")
    try:
        # the same account again, with the home it has: usermod is not asked to move it
        accounts.ensure_account(student, student, tmp_path / student, [settings.students_group])
        assert student in grp.getgrnam(settings.students_group).gr_mem
        with pytest.raises(RuntimeError, match="usermod"):
            accounts.ensure_account(student, student, tmp_path / "elsewhere", [])
    finally:
        busy.kill()
        busy.wait()
        accounts.remove_group(settings.students_group)
