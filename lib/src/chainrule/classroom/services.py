"""The class's two servers, started from Debian's packages: PostgreSQL and Redis.

- :class:`PostgresServer`: a PostgreSQL cluster of the class's own (``initdb`` into
  ``<class>/postgres``, run by the ``postgres`` account that Debian's ``postgresql`` package
  creates), listening on the class's address with password authentication, holding one
  database, the gradebook, owned by one role (:meth:`ensure_gradebook`).
- :class:`RedisServer`: ``redis-server`` (Debian's ``redis-server``) with a password and an
  append-only file, so that queued grading jobs survive a restart of the broker.

Both are started and stopped by :mod:`chainrule.classroom.deploy`; a server already running on
its folder is reused. Nothing here talks to the system's own clusters or services.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60.0


class ServiceError(RuntimeError):
    """A server could not be set up or started (the message says why)."""


def wait_for_port(host: str, port: int, timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise ServiceError(f"nothing answers on {host}:{port} after {timeout_s:g} s")


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def postgres_bin() -> Path:
    """The folder of Debian's PostgreSQL programs (the newest installed version)."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    if not versions:
        raise ServiceError(
            "PostgreSQL is not installed: `apt-get install postgresql` (Debian's package)"
        )
    return versions[-1].parent


def _as_postgres(args: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    """Run a PostgreSQL program as the ``postgres`` account (PostgreSQL refuses root)."""
    command = ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]


@dataclass
class PostgresServer:
    """A PostgreSQL cluster in ``datadir`` on ``host:port``."""

    datadir: Path
    host: str
    port: int

    @property
    def socket_dir(self) -> Path:
        return self.datadir / "sockets"

    @property
    def log_path(self) -> Path:
        return self.datadir / "server.log"

    def init(self) -> None:
        """Create the cluster if there is none: local connections by the ``postgres``
        account only (peer), TCP connections with a password (SCRAM)."""
        if (self.datadir / "PG_VERSION").exists():
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.datadir, "postgres", "postgres")
        self.datadir.chmod(0o700)
        result = _as_postgres(
            [
                str(postgres_bin() / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth-local=peer",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
            ]
        )
        if result.returncode != 0:
            raise ServiceError(f"initdb failed:\n{result.stdout}{result.stderr}")
        # workers on other machines connect over TCP, always with the password
        with (self.datadir / "pg_hba.conf").open("a") as hba:
            hba.write("host all all all scram-sha-256\n")

    def running(self) -> bool:
        return port_open(self.host, self.port)

    def start(self) -> None:
        """Start the server (after :meth:`init`) and wait until it accepts connections."""
        self.init()
        if self.running():
            return
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.socket_dir, "postgres", "postgres")
        options = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses={self.host} "
            "-c max_connections=200"
        )
        result = _as_postgres(
            [
                str(postgres_bin() / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.log_path),
                "-o",
                options,
                "-w",
                "-t",
                str(int(START_TIMEOUT_S)),
                "start",
            ]
        )
        if result.returncode != 0:
            log = ""
            if self.log_path.exists():
                log = self.log_path.read_text(errors="replace")[-3000:]
            raise ServiceError(f"PostgreSQL did not start:\n{result.stdout}{result.stderr}{log}")
        wait_for_port(self.host, self.port)

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are ended, data is kept)."""
        if not (self.datadir / "postmaster.pid").exists():
            return
        _as_postgres(
            [str(postgres_bin() / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"]
        )

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the ``postgres`` superuser over the local socket; its output."""
        result = _as_postgres(
            [
                str(postgres_bin() / "psql"),
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-tAc",
                sql,
            ]
        )
        if result.returncode != 0:
            raise ServiceError(f"psql failed on {sql.split()[0]} ...:\n{result.stderr}")
        return result.stdout

    def ensure_gradebook(self, database: str, password: str) -> None:
        """A role ``database`` with ``password`` that owns a database of the same name."""
        escaped = password.replace("'", "''")
        exists = self.psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{database}'").strip()
        verb = "ALTER" if exists else "CREATE"
        self.psql(f"{verb} ROLE \"{database}\" LOGIN PASSWORD '{escaped}'")
        if not self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}'").strip():
            self.psql(f'CREATE DATABASE "{database}" OWNER "{database}"')


@dataclass
class RedisServer:
    """``redis-server`` with its files in ``datadir``, on ``host:port``, with a password."""

    datadir: Path
    host: str
    port: int
    password: str

    @property
    def pid_path(self) -> Path:
        return self.datadir / "redis.pid"

    @property
    def config_path(self) -> Path:
        return self.datadir / "redis.conf"

    def write_config(self) -> None:
        """The server's configuration (mode 0600: it holds the password)."""
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.datadir.chmod(0o700)
        lines = [
            f"bind {self.host}",
            f"port {self.port}",
            "protected-mode yes",
            f"requirepass {self.password}",
            f"dir {self.datadir}",
            "appendonly yes",
            'save ""',
            f"pidfile {self.pid_path}",
            f"logfile {self.datadir / 'redis.log'}",
            "daemonize yes",
        ]
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")

    def running(self) -> bool:
        return port_open(self.host, self.port)

    def start(self) -> None:
        """Start the server (it daemonizes) and wait until it accepts connections."""
        if self.running():
            return
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceError("redis-server is not installed: `apt-get install redis-server`")
        self.write_config()
        result = subprocess.run(
            [binary, str(self.config_path)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise ServiceError(f"redis-server did not start:\n{result.stdout}{result.stderr}")
        wait_for_port(self.host, self.port)

    def stop(self) -> None:
        """Stop the server by its pid file (SIGTERM: it writes its append-only file first)."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
