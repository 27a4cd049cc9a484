"""Names for the students that autograding adds to the gradebook.

nbgrader's autograde creates a student from the name of the submission's folder and gives it no
first or last name, and the formgrader's *Manage Students* list then shows every such student as
"None, None" (it writes ``last_name + ", " + first_name`` with ``None`` for a missing one).
:class:`NameStudents` runs with autograde's sanitizing preprocessors (configured in
``nbgrader_config.py``, so the formgrader's *Autograde* button and ``make grade`` both run it) and
names a student that has neither name yet: from the full name of the computer account with the
student's id where that account has one (a class whose students log in to the machine, where
nbgrader names each submission after the login), else by the id itself, as the last name. Names
an instructor has set (``nbgrader db student add --first-name ...`` or the formgrader's edit
dialog) are never changed.
"""

from __future__ import annotations

import pwd
from typing import Any

from nbconvert.exporters.exporter import ResourcesDict
from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor


def account_name(student_id: str) -> tuple[str, str] | None:
    """``(first, last)`` from the full name of the computer account ``student_id``: the first
    field of its GECOS entry, when it has at least two words; ``None`` otherwise."""
    try:
        gecos = pwd.getpwnam(student_id).pw_gecos
    except (KeyError, OSError):
        return None
    words = gecos.split(",")[0].split()
    if len(words) < 2:
        return None
    return " ".join(words[:-1]), words[-1]


def student_names(student_id: str) -> tuple[str, str]:
    """``(first_name, last_name)`` for a student the gradebook has no names for.

    The account's full name where there is one; else the id as the last name and an empty first
    name, so that every formgrader page shows the id (the submission pages show the id when a
    name is empty, *Manage Students* shows ``"<id>, "``).
    """
    return account_name(student_id) or ("", student_id)


def name_student(gradebook: Any, student_id: str) -> bool:
    """Give ``student_id`` names in an open nbgrader ``Gradebook`` if it has neither; whether it
    did (a student that is not in the gradebook is left alone)."""
    from nbgrader.api import MissingEntry

    try:
        student = gradebook.find_student(student_id)
    except MissingEntry:
        return False
    if student.first_name or student.last_name:
        return False
    first, last = student_names(student_id)
    gradebook.update_or_create_student(student_id, first_name=first, last_name=last)
    return True


class NameStudents(NbGraderPreprocessor):
    """Name the student being autograded when the gradebook has no name for it (the notebook is
    left as it is)."""

    def preprocess(
        self, nb: NotebookNode, resources: ResourcesDict
    ) -> tuple[NotebookNode, ResourcesDict]:
        """Name the student of ``resources`` in its gradebook if it has no name."""
        from nbgrader.api import Gradebook

        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            if name_student(gb, info["student"]):
                self.log.info("Named student %r after its id or account", info["student"])
        return nb, resources
