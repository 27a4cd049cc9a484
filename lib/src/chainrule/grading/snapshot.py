"""Submissions as immutable input: every submission is copied before any student's code runs.

The batch grader copies ``submitted/<student>/<assignment>`` of every student it will grade into
``grades/<assignment>/snapshots/<student>/<assignment>`` first, and grades from those copies
(nbgrader's ``CourseDirectory.submitted_directory`` points there). Only regular files are copied:
a symbolic link (to the instructor's notebook, say) or any other special file is left out and
reported, so nothing outside the student's own files can reach a kernel, an autograded folder
or the feedback. ``submitted/`` itself is only ever read.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chainrule.grading.execute import copy_regular_files


@dataclass
class Snapshots:
    """The snapshot folder and, per student, the files that were not copied."""

    root: Path
    skipped: dict[str, list[str]] = field(default_factory=dict)


def take_snapshots(
    submitted: Path, assignment: str, students: Sequence[str], root: Path
) -> Snapshots:
    """Copy each student's submission of ``assignment`` under ``root`` (emptied first)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    snapshots = Snapshots(root)
    for student in students:
        source = submitted / student / assignment
        if source.is_symlink() or (submitted / student).is_symlink():
            snapshots.skipped[student] = [f"{student}/{assignment} (a symbolic link)"]
            (root / student / assignment).mkdir(parents=True)
            continue
        skipped = copy_regular_files(source, root / student / assignment)
        if skipped:
            snapshots.skipped[student] = skipped
    return snapshots
