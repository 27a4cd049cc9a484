"""The course's nbgrader configuration and the environment grading runs in.

nbgrader's Python API does not read ``nbgrader_config.py`` by itself, so the grading pipeline
loads it here with traitlets' ``PyFileConfigLoader``, then layers on extra config files and
command-line overrides such as ``--Execute.timeout=5`` (the same syntax nbgrader accepts).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import KVArgParseConfigLoader, PyFileConfigLoader

CONFIG_FILENAME = "nbgrader_config.py"


def load_config(
    course_root: str | Path,
    config_files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
) -> Config:
    """Read ``<course_root>/nbgrader_config.py``, then each extra config file, then overrides.

    ``overrides`` are nbgrader-style arguments, e.g. ``["--Execute.timeout=5"]``. Later sources
    win. ``CourseDirectory.root`` defaults to ``course_root`` when no file sets it.
    """
    root = Path(course_root).resolve()
    config = Config()
    config.CourseDirectory.root = str(root)
    course_file = root / CONFIG_FILENAME
    if course_file.exists():
        config.merge(_load_py_config(course_file))
    for extra in config_files:
        config.merge(_load_py_config(Path(extra)))
    if overrides:
        config.merge(KVArgParseConfigLoader(list(overrides)).load_config())
    return config


def _load_py_config(path: Path) -> Config:
    """Load one traitlets Python config file."""
    path = path.resolve()
    return PyFileConfigLoader(path.name, path=str(path.parent)).load_config()


@dataclass(frozen=True)
class CourseLayout:
    """Where an nbgrader course keeps its gradebook and its per-step folders."""

    root: Path
    course_id: str
    db_url: str
    submitted: Path
    autograded: Path
    feedback: Path
    source: Path

    @classmethod
    def from_config(cls, config: Config) -> CourseLayout:
        """Resolve the course folders the way nbgrader's ``CourseDirectory`` does."""
        from nbgrader.coursedir import CourseDirectory

        coursedir = CourseDirectory(config=config)
        root = Path(coursedir.root)
        return cls(
            root=root,
            course_id=coursedir.course_id,
            db_url=coursedir.db_url,
            submitted=root / coursedir.submitted_directory,
            autograded=root / coursedir.autograded_directory,
            feedback=root / coursedir.feedback_directory,
            source=root / coursedir.source_directory,
        )

    def source_notebooks(self, assignment: str) -> list[Path]:
        """The instructor's notebooks of ``assignment`` (``source/<assignment>/*.ipynb``)."""
        return sorted((self.source / assignment).glob("*.ipynb"))

    def submission_dir(self, student: str, assignment: str) -> Path:
        """``submitted/<student>/<assignment>``."""
        return self.submitted / student / assignment

    def autograded_dir(self, student: str, assignment: str) -> Path:
        """``autograded/<student>/<assignment>``."""
        return self.autograded / student / assignment

    def feedback_dir(self, student: str, assignment: str) -> Path:
        """``feedback/<student>/<assignment>``."""
        return self.feedback / student / assignment


def sqlite_path(db_url: str) -> Path:
    """The file behind an ``sqlite:///`` URL (``ValueError`` for any other database)."""
    prefix = "sqlite:///"
    if not db_url.startswith(prefix):
        raise ValueError(f"not an SQLite gradebook: {db_url}")
    return Path(db_url[len(prefix) :])


#: Environment variables that make a grading kernel reproducible and keep parallel graders
#: from oversubscribing the cores; each is set only when the caller has not set it already.
REPRODUCIBLE_DEFAULTS: Mapping[str, str] = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}


def grading_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a grading subprocess and the kernels it starts.

    The interpreter's ``bin/`` comes first on ``PATH`` (nbgrader runs ``alembic`` from there
    when it opens a gradebook), and :data:`REPRODUCIBLE_DEFAULTS` fill in what is unset, so the
    same submission always gets the same hash seed.
    """
    env = dict(os.environ if base is None else base)
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
    for name, value in REPRODUCIBLE_DEFAULTS.items():
        env.setdefault(name, value)
    return env
