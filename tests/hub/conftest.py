"""Fixtures of the class deployment's tests: one class per test session, set up and started by
the project's own deployment code (:mod:`chainrule.classroom.deploy`).

- ``classroom`` (session): ``setup_class`` into a temporary folder (accounts of a roster with
  fresh names, the course folder, the exchange, PostgreSQL with ``check_yourself`` generated
  into the gradebook), PostgreSQL and Redis started, two grading workers; everything stopped and
  the accounts removed at the end.
- ``hub`` (session): the same class's JupyterHub, started on first use.
- ``browser`` (session): Debian's chromium through Playwright.

Tests here are marked ``hub``. They need root (accounts), Debian's ``postgresql`` and
``redis-server``, the pinned proxy (``npm ci --prefix hub``), bubblewrap and chromium: where one
is missing they are skipped with the reason, except in CI (``CI`` set), where ``.ci/run``
installs them all and a missing one is a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from chainrule.classroom.deploy import PROXY, Deployment, setup_class, teardown_class
from chainrule.classroom.settings import Roster
from running_class import Classroom

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("HUB_ARTIFACTS", REPO / "test-artifacts" / "hub"))
CHROMIUM = Path("/usr/bin/chromium")


def missing_parts() -> list[str]:
    """What this machine lacks to run a class."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the class's accounts are Linux accounts)")
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        missing.append("PostgreSQL (apt-get install postgresql)")
    if shutil.which("redis-server") is None:
        missing.append("redis-server (apt-get install redis-server)")
    if not PROXY.exists():
        missing.append("configurable-http-proxy (npm ci --prefix hub)")
    if shutil.which("bwrap") is None:
        missing.append("bubblewrap (apt-get install bubblewrap)")
    return missing


def require(parts: list[str]) -> None:
    if not parts:
        return
    reason = "missing " + ", ".join(parts)
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must install them", pytrace=False)
    pytest.skip(reason)


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports on 127.0.0.1 nothing listens on, each followed by two free ones
    (JupyterHub uses the hub's port + 1 and + 2)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + 2 < 65536 and all(_free(p) for p in (port, port + 1, port + 2)):
            if not any(abs(port - p) < 3 for p in ports):
                ports.append(port)
    return ports


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def classroom() -> Iterator[Classroom]:
    require(missing_parts())
    tag = secrets.token_hex(2)
    instructor = f"cr{tag}i"
    students = (f"cr{tag}a", f"cr{tag}b")
    people = {students[0]: "Ada Lovelace", students[1]: "Alan Turing"}
    roster = Roster({instructor: "Grace Hopper"}, people)
    passwords = {login: secrets.token_urlsafe(12) for login in (instructor, *students)}
    root = Path(tempfile.mkdtemp(prefix="chainrule-class-", dir="/tmp"))
    hub, postgres, redis, formgrader = free_ports(4)
    settings = setup_class(
        root,
        roster,
        REPO,
        passwords=passwords,
        hub_port=hub,
        postgres_port=postgres,
        redis_port=redis,
        formgrader_port=formgrader,
        assignments=["check_yourself"],
    )
    deployment = Deployment(settings)
    try:
        deployment.start(hub=False, workers=2)
        yield Classroom(settings, deployment, instructor, students, passwords)
    finally:
        deployment.stop()
        keep = ARTIFACTS / "logs"
        keep.mkdir(parents=True, exist_ok=True)
        for log in settings.logs.glob("*.log"):
            shutil.copy(log, keep / log.name)
        teardown_class(settings)


@pytest.fixture(scope="session")
def hub(classroom: Classroom) -> Classroom:
    """The class's JupyterHub, running (stopped with the class)."""
    if classroom.deployment.hub is None:
        classroom.deployment.start_hub()
    return classroom


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    return ARTIFACTS


@pytest.fixture(scope="session")
def browser(playwright):  # noqa: ANN001, ANN201 - Playwright's API and a browser
    if not CHROMIUM.exists():
        require([f"{CHROMIUM} (apt-get install chromium)"])

    args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
    ]
    chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
    try:
        yield chromium
    finally:
        chromium.close()
