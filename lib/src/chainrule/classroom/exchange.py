"""nbgrader's own exchange, with permissions no student can read another's work through.

nbgrader's file-system exchange keeps each course in ``<root>/<course>/`` with ``outbound/``
(releases), ``inbound/`` (submissions) and ``feedback/``. Its own modes are nearly right; this
module sets the rest (:func:`prepare_exchange`), and :class:`PrivateSubmit` corrects the one
place nbgrader itself opens up:

- ``<root>`` is ``1777`` (every nbgrader command checks that it can write there) *with the
  sticky bit*, so no one can rename or remove another account's course folder (and put a
  release of their own in its place);
- ``<course>/`` and ``outbound/`` belong to the grader account, ``0755``: students read
  releases and cannot change them;
- ``inbound/`` is ``3733``: students may enter it and create a submission, but not list it;
  with the sticky bit no one but the grader can rename or remove an entry; with the set-group
  bit every submission belongs to the graders' group;
- ``feedback/`` is ``0711``: no listing; each feedback file is named by a hash of the student's
  own submission secret, which only that student (and the instructors) know;
- nbgrader makes each submission folder ``0777`` and its files ``0644`` ("hidden by the
  timestamp": readable by anyone who learns the name). :class:`PrivateSubmit` submits exactly as
  nbgrader does, then closes the submission's folders to everyone but their owner and the
  graders' group, which they belong to (inherited from ``inbound/``): folders ``0770``, so no
  other student can enter them, whatever their files' modes (``0644``: the files nbgrader
  writes last, the timestamp and the submission's secret, are in the student's own group).

Students' home folders are ``0700``. ``ExchangeCollect.check_owner`` stays on, so a
submission put in under another student's name is reported and skipped at collection.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nbgrader.exchange.default.submit import ExchangeSubmit

SUBMISSION_DIR_MODE = 0o770
SUBMISSION_FILE_MODE = 0o644


def prepare_exchange(root: Path, course_id: str, grader: str, graders_group: str) -> Path:
    """Create (or correct) the exchange's folders with the modes of the module docstring;
    the course's folder."""
    root.mkdir(parents=True, exist_ok=True)
    os.chown(root, 0, 0)
    root.chmod(0o1777)
    course = root / course_id
    modes = {course: 0o755, course / "outbound": 0o755, course / "inbound": 0o3733}
    modes[course / "feedback"] = 0o711
    for folder, mode in modes.items():
        folder.mkdir(exist_ok=True)
        shutil.chown(folder, grader, graders_group)
        folder.chmod(mode)
    return course


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, whose submission only its owner and the graders' group can enter."""

    def copy_files(self) -> None:
        super().copy_files()
        dest = Path(self.inbound_path) / self.assignment_filename
        for folder, dirs, files in os.walk(dest):
            for name in files:
                os.chmod(os.path.join(folder, name), SUBMISSION_FILE_MODE)
            for name in dirs:
                os.chmod(os.path.join(folder, name), SUBMISSION_DIR_MODE)
        os.chmod(dest, SUBMISSION_DIR_MODE)
