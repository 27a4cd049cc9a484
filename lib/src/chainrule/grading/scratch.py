"""Scratch folders that a killed grader does not leave behind.

A batch keeps its kernels' private folders in a new folder of the temporary folder, and a queue
worker's job keeps there what it grades (the snapshots, a private gradebook, its kernels'
folders). Each removes its folder when it finishes, but a process killed on the way (SIGKILL,
the OOM killer, a machine that stopped) cannot. So the process that makes a folder holds an
advisory lock on it (``flock``) for as long as it lives, which the operating system drops when
the process ends however it ends; and each new folder of a kind is made after removing the
folders of that kind that no process holds.

A folder is locked before it gets the name others look for: it is made under a hidden name,
locked, then renamed, so no folder can be seen unlocked while its maker is alive.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

_held: dict[Path, int] = {}  # each folder this process made, and the locked descriptor


def make(prefix: str, parent: str | Path | None = None) -> Path:
    """A new folder ``<parent>/<prefix>XXXXXXXX`` (``parent``: the temporary folder by
    default) held by this process until :func:`remove`, made after removing the abandoned
    folders of the same ``prefix`` there (:func:`remove_abandoned`)."""
    parent = Path(parent or tempfile.gettempdir())
    remove_abandoned(prefix, parent)
    hidden = Path(tempfile.mkdtemp(prefix=f".{prefix}", dir=parent))
    descriptor = os.open(hidden, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by exec
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    folder = parent / hidden.name[1:]
    os.rename(hidden, folder)
    _held[folder] = descriptor
    return folder


def remove(folder: str | Path) -> None:
    """Remove ``folder`` and everything in it, and let go of its lock."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    descriptor = _held.pop(folder, None)
    if descriptor is not None:
        os.close(descriptor)


def remove_abandoned(prefix: str, parent: str | Path) -> list[Path]:
    """Remove the folders ``<parent>/<prefix>*`` that no living process holds (their makers
    were killed); folders of other users, which this process cannot open, stay. Returns the
    folders removed."""
    removed = []
    for folder in Path(parent).glob(f"{prefix}*"):
        try:
            descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # gone already, not a folder, or another user's
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its maker (or a process it forked) is alive
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(descriptor)
    return removed
