"""The exchange round trip on one machine: release → fetch → submit → collect.

The course's ``nbgrader_config.py`` puts the exchange at ``$NBGRADER_EXCHANGE`` (default
``<course>/exchange``) with ``path_includes_course = True``. Here the instructor releases into a
temporary exchange, a student working in a folder of their own (with a three-line
``nbgrader_config.py`` pointing at the same exchange) fetches, works and submits under the id
``ada`` (``--student``; nbgrader otherwise takes the OS user name), and the instructor collects.
"""

from __future__ import annotations

import nbformat
import pytest
from grading_course import grading_env, make_course, nbgrader, solve

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

STUDENT_CONFIG = """\
import os
c = get_config()
c.CourseDirectory.course_id = "autograd-distributed"
c.Exchange.root = os.environ["NBGRADER_EXCHANGE"]
c.Exchange.path_includes_course = True
c.Exchange.cache = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".nbgrader-cache")
"""


def test_release_fetch_submit_collect(tmp_path):
    course = make_course(tmp_path / "course")
    exchange = tmp_path / "exchange"
    exchange.mkdir(mode=0o777)
    exchange.chmod(0o777)  # every student must be able to write their submission into it
    env = dict(grading_env(), NBGRADER_EXCHANGE=str(exchange))

    nbgrader(course.root, "release_assignment", "tiny", env=env)
    released = exchange / "autograd-distributed" / "outbound" / "tiny" / "squares.ipynb"
    assert released.exists()

    home = tmp_path / "ada"
    home.mkdir()
    (home / "nbgrader_config.py").write_text(STUDENT_CONFIG)
    listed = nbgrader(home, "list", env=env)
    assert "autograd-distributed tiny" in listed
    nbgrader(home, "fetch_assignment", "tiny", env=env)
    fetched = home / "autograd-distributed" / "tiny"
    assert sorted(p.name for p in fetched.glob("*.ipynb")) == ["doubles.ipynb", "squares.ipynb"]

    notebooks = {name: nbformat.read(fetched / f"{name}.ipynb", 4) for name in ("squares",)}
    solve(notebooks)
    nbformat.write(notebooks["squares"], fetched / "squares.ipynb")
    nbgrader(home, "submit", "tiny", "--student=ada", env=env)
    inbound = list((exchange / "autograd-distributed" / "inbound").glob("ada+tiny+*"))
    assert len(inbound) == 1

    nbgrader(course.root, "collect", "tiny", env=env)
    submitted = course.root / "submitted" / "ada" / "tiny"
    names = {p.name for p in submitted.iterdir()}
    assert {"doubles.ipynb", "squares.ipynb", "timestamp.txt"} <= names
    work = nbformat.read(submitted / "squares.ipynb", 4)
    assert "return x * x" in "\n".join(cell.source for cell in work.cells)  # the student's work
