"""Where a class lives and how its services are reached: one JSON file, ``class.json``.

``python -m chainrule.classroom setup`` writes it into the class's folder (``/srv/<course>`` by
default), readable by root and the course's graders only (it holds the passwords of the
gradebook and of the broker). Every part of the deployment reads it: the hub's configuration,
the formgrader service, the course's ``nbgrader_config.py`` (for ``CourseDirectory.db_url``)
and each grading worker. A worker on another machine gets a copy with ``host`` set to the
address the first machine's services listen on.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

#: The environment variable that names a class's settings file.
SETTINGS_ENV = "CHAINRULE_CLASS"
COURSE_ID = "autograd-distributed"


@dataclass
class Roster:
    """The class's people: ``{login: full name}`` for instructors and for students."""

    instructors: dict[str, str] = field(default_factory=dict)
    students: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Roster:
        """A roster from a JSON file ``{"instructors": {...}, "students": {...}}``."""
        data = json.loads(Path(path).read_text())
        return cls(dict(data.get("instructors", {})), dict(data.get("students", {})))


@dataclass
class ClassSettings:
    """One class: its folder, course, accounts' groups and its services' addresses."""

    root: Path
    course_id: str = COURSE_ID
    host: str = "127.0.0.1"
    hub_port: int = 8000
    postgres_port: int = 5433
    redis_port: int = 6380
    formgrader_port: int = 9999
    db_password: str = field(default_factory=lambda: secrets.token_hex(16))
    redis_password: str = field(default_factory=lambda: secrets.token_hex(16))
    #: Seconds after which a job a worker took but never acknowledged (its machine died) goes
    #: back to the queue. Longer than any job: the per-submission time limit, with a margin.
    visibility_timeout_s: float = 900.0

    # -- names ----------------------------------------------------------------------------

    @property
    def grader_account(self) -> str:
        """The account that owns the course folder and runs the formgrader service."""
        return f"grader-{self.course_id}"

    @property
    def formgrade_group(self) -> str:
        """nbgrader's group of the course's graders (hub group and Linux group alike)."""
        return f"formgrade-{self.course_id}"

    @property
    def students_group(self) -> str:
        """nbgrader's group of the course's students (hub group and Linux group alike)."""
        return f"nbgrader-{self.course_id}"

    @property
    def database(self) -> str:
        """The gradebook's PostgreSQL database (and its owner role)."""
        return self.course_id.replace("-", "_")

    # -- folders --------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """This file."""
        return self.root / "class.json"

    @property
    def grader_home(self) -> Path:
        """The grader account's home: the formgrader service's root folder."""
        return self.root / "grader"

    @property
    def course_dir(self) -> Path:
        """The nbgrader course folder (``source/``, ``release/``, ``submitted/``, ...)."""
        return self.grader_home / self.course_id

    @property
    def exchange(self) -> Path:
        """nbgrader's exchange (``Exchange.root``)."""
        return self.root / "exchange"

    @property
    def homes(self) -> Path:
        """The students' and instructors' home folders."""
        return self.root / "home"

    @property
    def hub_dir(self) -> Path:
        """JupyterHub's own state: its database, cookie secret and log (root only)."""
        return self.root / "hub"

    @property
    def jupyter_config(self) -> Path:
        """Jupyter configuration every account's server reads (``JUPYTER_CONFIG_PATH``)."""
        return self.root / "jupyter"

    @property
    def postgres_dir(self) -> Path:
        return self.root / "postgres"

    @property
    def redis_dir(self) -> Path:
        return self.root / "redis"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    # -- addresses ------------------------------------------------------------------------

    @property
    def db_url(self) -> str:
        """``CourseDirectory.db_url`` of the gradebook (SQLAlchemy with psycopg 3)."""
        password = quote(self.db_password, safe="")
        return (
            f"postgresql+psycopg://{self.database}:{password}@{self.host}:"
            f"{self.postgres_port}/{self.database}"
        )

    @property
    def broker_url(self) -> str:
        """The Celery broker (Redis database 0; results in database 1)."""
        return f"redis://:{quote(self.redis_password, safe='')}@{self.host}:{self.redis_port}/0"

    @property
    def result_url(self) -> str:
        return f"redis://:{quote(self.redis_password, safe='')}@{self.host}:{self.redis_port}/1"

    @property
    def hub_url(self) -> str:
        return f"http://{self.host}:{self.hub_port}"

    # -- file -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["root"] = str(self.root)
        return data

    def write(self, path: Path | None = None) -> Path:
        """Write the settings (mode 0640: root and the graders' group)."""
        path = path or self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        with os.fdopen(fd, "w") as out:
            json.dump(self.to_json(), out, indent=1)
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, path: str | Path | None = None) -> ClassSettings:
        """The settings in ``path``, else in ``$CHAINRULE_CLASS``, else ``/srv/<course>``."""
        if path is None:
            path = os.environ.get(SETTINGS_ENV) or f"/srv/{COURSE_ID}/class.json"
        data = json.loads(Path(path).read_text())
        data["root"] = Path(data["root"])
        return cls(**data)
