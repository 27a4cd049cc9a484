"""The class's Linux accounts and groups (as root, with shadow's ``useradd`` and friends).

Every person of the roster gets an account whose login is the JupyterHub user name and the
nbgrader student id, with a home folder of mode 0700 (nobody else reads a student's work), a
full name (nbgrader names students after it) and membership of nbgrader's group for their role:
``nbgrader-<course>`` for students, ``formgrade-<course>`` for instructors and the course's
grader account. Any JupyterHub authenticator works in production; this one is PAM, so the
accounts need passwords.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

NOLOGIN = "/usr/sbin/nologin"


def _run(args: Sequence[str], stdin: str | None = None) -> None:
    result = subprocess.run(list(args), input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")


def ensure_group(name: str) -> None:
    """A Linux group ``name``."""
    try:
        grp.getgrnam(name)
    except KeyError:
        _run(["groupadd", name])


def ensure_account(
    login: str,
    full_name: str,
    home: Path,
    groups: Sequence[str],
    password: str | None = None,
    home_mode: int = 0o700,
    shell: str = "/bin/bash",
) -> None:
    """An account ``login`` with this name, home, groups and password (created or updated)."""
    for group in groups:
        ensure_group(group)
    try:
        entry = pwd.getpwnam(login)
        # Only what differs is changed: usermod refuses some changes (a new home) while the
        # account runs a process, and an unchanged account needs none.
        changes = []
        if entry.pw_gecos != full_name:
            changes += ["-c", full_name]
        if entry.pw_dir != str(home):
            changes += ["-d", str(home)]
        if entry.pw_shell != shell:
            changes += ["-s", shell]
        if changes:
            _run(["usermod", *changes, login])
        for group in groups:
            if login not in grp.getgrnam(group).gr_mem:
                _run(["usermod", "-a", "-G", group, login])
    except KeyError:
        args = ["useradd", "-M", "-c", full_name, "-d", str(home), "-s", shell, "-U", login]
        if groups:
            args[1:1] = ["-G", ",".join(groups)]
        _run(args)
    entry = pwd.getpwnam(login)
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    home.chmod(home_mode)
    if password is not None:
        _run(["chpasswd"], stdin=f"{login}:{password}\n")


def stop_processes(login: str, command: str | None = None, grace: float = 5.0) -> int:
    """Stop the processes of ``login`` (only those whose command line contains ``command``, if
    given): SIGTERM, then SIGKILL for those still running after ``grace`` seconds. Returns
    how many there were."""
    import psutil

    uid = pwd.getpwnam(login).pw_uid
    mine = []
    for process in psutil.process_iter(["uids", "cmdline"]):
        uids, cmdline = process.info["uids"], process.info["cmdline"] or []
        if (
            uids is not None
            and uids.real == uid
            and (command is None or command in " ".join(cmdline))
        ):
            mine.append(process)
    for process in mine:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, running = psutil.wait_procs(mine, timeout=grace)
    for process in running:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(running, timeout=grace)
    return len(mine)


def remove_account(login: str) -> None:
    """Remove the account and its own group (its home is the class folder's to remove)."""
    try:
        pwd.getpwnam(login)
    except KeyError:
        return
    subprocess.run(["pkill", "-KILL", "-u", login], capture_output=True, check=False)
    _run(["userdel", login])


def remove_group(name: str) -> None:
    try:
        grp.getgrnam(name)
    except KeyError:
        return
    _run(["groupdel", name])


def write_as(login: str, path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` (folders made as needed), all owned by ``login``."""
    entry = pwd.getpwnam(login)
    home = Path(entry.pw_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent
    while folder != home and home in folder.parents:
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        folder = folder.parent
    path.write_text(text)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(mode)


def chown_tree(path: Path, login: str, group: str | None = None) -> None:
    """Give ``path`` and everything under it to ``login`` (and ``group``)."""
    shutil.chown(path, login, group)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            shutil.chown(os.path.join(folder, name), login, group)


def readable_by_everyone(path: Path) -> list[Path]:
    """Let every account reach ``path`` (a virtual environment the students' servers run
    from): add the search bit (``o+x``, not listing) to each folder above it that lacks it.
    Returns the folders changed."""
    changed = []
    for folder in [*reversed(Path(path).resolve().parents)]:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod(mode | 0o001)
            changed.append(folder)
    return changed
