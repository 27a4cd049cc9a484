"""Submissions as immutable input: every submission is copied before any student's code runs.

The batch grader copies ``submitted/<student>/<assignment>`` of every student it will grade into
``grades/<assignment>/snapshots/<student>/<assignment>`` first, and grades from those copies
(nbgrader's ``CourseDirectory.submitted_directory`` points there). Only regular files are copied:
a symbolic link (to the instructor's notebook, say) or any other special file is left out and
reported, so nothing outside the student's own files can reach a kernel, an autograded folder
or the feedback. ``submitted/`` itself is only ever read.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chainrule.grading.execute import copy_regular_files


def shadowing_entries(folder: Path) -> list[str]:
    """Top-level files and folders of a submission named like an importable module.

    They cannot shadow anything at grading time (kernels start with ``python -P``), but a
    submission that brings its own ``numpy/`` or ``chainrule/`` deserves a look.
    """
    found = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        name = path.stem if path.suffix == ".py" else path.name
        if not name.isidentifier() or path.suffix not in ("", ".py"):
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            found.append(path.name)
    return found


@dataclass
class Snapshots:
    """The snapshot folder and, per student, the files that were not copied."""

    root: Path
    skipped: dict[str, list[str]] = field(default_factory=dict)
    shadowing: dict[str, list[str]] = field(default_factory=dict)


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
        shadowing = shadowing_entries(root / student / assignment)
        if shadowing:
            snapshots.shadowing[student] = shadowing
    return snapshots
