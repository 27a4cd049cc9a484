"""Submissions as immutable input: every submission is copied before any student's code runs.

The batch grader copies ``submitted/<student>/<assignment>`` of every student it will grade
before it grades anyone, and grades from the copies; ``submitted/`` itself is only ever read.
The copy trusts nothing in the submission:

- it takes only **regular files the submission's owner owns, with no other name**: a symbolic
  link, a hard link (to the instructor's notebook or the gradebook, say), a file of another
  owner, a device, a socket or a FIFO is left out and reported;
- it never follows a link, and it is immune to the submission changing while it is copied:
  every folder and file is opened relative to its parent's open descriptor with
  ``O_NOFOLLOW``, checked with ``fstat`` on that descriptor, and read from it, so swapping a
  file or a folder for a link between the check and the read changes nothing;
- sizes are bounded (:data:`MAX_FILE_BYTES`, :data:`MAX_TOTAL_BYTES`);
- an error while copying one submission fails that student, never the batch.

Each submission gives two copies: ``notebooks/<student>/<assignment>`` holds the assignment's
notebooks, nbgrader's ``timestamp.txt`` and its ``submission_secret.txt`` (from which
``release_feedback`` names the student's feedback in the exchange), and nothing else (nbgrader
reads it and copies what it holds to ``autograded/`` and ``feedback/``, so no other file a
submission brings reaches them);
``files/<student>/<assignment>`` holds every file copied, and becomes the home folder of the
student's sandbox.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_TOTAL_BYTES = 256 * 1024 * 1024
TIMESTAMP = "timestamp.txt"
SUBMISSION_SECRET = "submission_secret.txt"
_CHUNK = 1024 * 1024


class SnapshotError(Exception):
    """The submission could not be copied (the student is not graded, with this reason)."""


@dataclass
class Snapshot:
    """One student's copies, what was left out of them (``path (why)``), the top-level files
    named like importable modules, and the error that stopped the copy, if any."""

    notebooks: Path
    files: Path
    skipped: list[str] = field(default_factory=list)
    shadowing: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Snapshots:
    """The snapshot folder and each student's :class:`Snapshot`."""

    root: Path
    students: dict[str, Snapshot] = field(default_factory=dict)

    @property
    def notebooks_root(self) -> Path:
        """The folder nbgrader reads as ``submitted/``."""
        return self.root / "notebooks"


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


class _Copier:
    """Copies one submission's tree from open descriptors (see the module docstring)."""

    def __init__(self, owner: int, destination: Path) -> None:
        self.owner = owner
        self.destination = destination
        self.skipped: list[str] = []
        self.copied: list[str] = []
        self.total = 0

    def folder(self, fd: int, relative: str) -> None:
        (self.destination / relative).mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(fd)):
            path = f"{relative}/{name}" if relative else name
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                self._open_and(fd, name, path, os.O_DIRECTORY, stat.S_ISDIR, self._subfolder)
            elif stat.S_ISREG(info.st_mode):
                self._open_and(fd, name, path, 0, stat.S_ISREG, self._file)
            else:
                self.skipped.append(f"{path} ({_kind(info.st_mode)})")

    def _open_and(self, parent: int, name: str, path: str, flags: int, check, then) -> None:  # noqa: ANN001
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | flags, dir_fd=parent)
        except OSError as error:  # swapped for a link or removed since it was listed
            self.skipped.append(f"{path} (changed while it was copied: {error.strerror})")
            return
        try:
            info = os.fstat(fd)
            if not check(info.st_mode):
                self.skipped.append(f"{path} (changed while it was copied)")
            elif info.st_uid != self.owner:
                self.skipped.append(f"{path} (owned by another user)")
            elif stat.S_ISREG(info.st_mode) and info.st_nlink != 1:
                self.skipped.append(f"{path} (a hard link: the file has other names)")
            else:
                then(fd, path, info)
        finally:
            os.close(fd)

    def _subfolder(self, fd: int, path: str, info: os.stat_result) -> None:
        self.folder(fd, path)

    def _file(self, fd: int, path: str, info: os.stat_result) -> None:
        if info.st_size > MAX_FILE_BYTES or self.total + info.st_size > MAX_TOTAL_BYTES:
            self.skipped.append(f"{path} (too large: {info.st_size} bytes)")
            return
        with open(self.destination / path, "wb") as out:
            while self.total <= MAX_TOTAL_BYTES:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                self.total += len(chunk)
        if self.total > MAX_TOTAL_BYTES:
            raise SnapshotError(f"the submission is larger than {MAX_TOTAL_BYTES} bytes")
        self.copied.append(path)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _open_folder(path: Path, parent: int | None = None) -> int:
    """An open descriptor of the folder ``path`` (a name in ``parent`` if given), never
    through a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    name = str(path) if parent is None else path.name
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as error:
        raise SnapshotError(f"{path} cannot be opened as a folder: {error.strerror}") from None


def snapshot_submission(
    submitted: Path, student: str, assignment: str, notebooks: Sequence[str], root: Path
) -> Snapshot:
    """Copy ``submitted/<student>/<assignment>`` into ``root`` (see the module docstring)."""
    snapshot = Snapshot(
        notebooks=root / "notebooks" / student / assignment,
        files=root / "files" / student / assignment,
    )
    snapshot.notebooks.mkdir(parents=True)
    snapshot.files.mkdir(parents=True)
    try:
        top = _open_folder(submitted)
        try:
            student_fd = _open_folder(submitted / student, top)
            try:
                owner = os.fstat(student_fd).st_uid
                folder = _open_folder(submitted / student / assignment, student_fd)
                try:
                    copier = _Copier(owner, snapshot.files)
                    copier.folder(folder, "")
                finally:
                    os.close(folder)
            finally:
                os.close(student_fd)
        finally:
            os.close(top)
    except (OSError, SnapshotError) as error:
        shutil.rmtree(snapshot.files, ignore_errors=True)
        snapshot.files.mkdir(parents=True)
        snapshot.error = str(error) if isinstance(error, SnapshotError) else repr(error)
        return snapshot
    snapshot.skipped = copier.skipped
    wanted = {f"{name}.ipynb" for name in notebooks} | {TIMESTAMP, SUBMISSION_SECRET}
    for name in copier.copied:
        if name in wanted:
            shutil.copyfile(snapshot.files / name, snapshot.notebooks / name)
    snapshot.shadowing = shadowing_entries(snapshot.files)
    return snapshot


def take_snapshots(
    submitted: Path,
    assignment: str,
    students: Sequence[str],
    notebooks: Sequence[str],
    root: Path,
) -> Snapshots:
    """Copy each student's submission of ``assignment`` under ``root`` (emptied first)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    snapshots = Snapshots(root)
    for student in students:
        snapshots.students[student] = snapshot_submission(
            submitted, student, assignment, notebooks, root
        )
    return snapshots
