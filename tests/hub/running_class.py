"""A class that the hub's tests run (made by the ``classroom`` fixture of ``conftest.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from chainrule.classroom.deploy import Deployment
from chainrule.classroom.settings import ClassSettings


@dataclass
class Classroom:
    """A running class: its settings, deployment, people and their passwords."""

    settings: ClassSettings
    deployment: Deployment
    instructor: str
    students: tuple[str, str]
    passwords: dict[str, str]

    def database(self, name: str) -> str:
        """A gradebook database ``name`` of its own in the class's PostgreSQL; its URL."""
        password = f"{name}-password"
        self.deployment.postgres.ensure_gradebook(name, password)
        s = self.settings
        return f"postgresql+psycopg://{name}:{password}@{s.host}:{s.postgres_port}/{name}"
