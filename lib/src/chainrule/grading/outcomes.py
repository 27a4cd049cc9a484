"""What happened to each submission: graded, graded but flagged, or not graded.

nbgrader's export shows a submission that could not be graded as 0, the same as a real zero.
The pipeline keeps its own record instead: one :class:`NotebookOutcome` per notebook and one
:class:`StudentOutcome` per student, whose ``status`` reads ``graded``, ``graded: locked cells
restored (...)``, ``flagged: <reason>`` or ``failed: <reason>``. A failed notebook's score is
not a grade. A flagged one is: every point in it was earned by a test that ran as written, but
something needs the instructor's eyes: the kernel died (the tests after it earned nothing), some
tests did not run as written (they earned nothing), the student's code reaches into the kernel
or the grader, or the submission brings files that were left out or are named like installed
modules.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

TIMEOUT = "timeout"
KERNEL_DIED = "kernel died"
CORRUPT_JSON = "corrupt notebook JSON"
INVALID_NOTEBOOK = "invalid notebook"
MEMORY_LIMIT = "memory limit"
GRADER_CRASHED = "grader crashed"
GRADING_ERROR = "grading error"
SANDBOX_FAILED = "sandbox failed"
SNAPSHOT_FAILED = "submission could not be copied"
NOT_AS_WRITTEN = "tests did not run as written"
REACHES_INTO_GRADER = "code reaches into the kernel or the grader"
SUBMITTED_FILES = "files to look at"

#: (pattern in nbgrader's log or traceback, reason), first match wins: a corrupt file is
#: reported before the exception it causes, memory before the dead kernel it can cause.
_FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"NotJSONError|does not appear to be JSON|JSONDecodeError", CORRUPT_JSON),
    (r"MemoryError|Cannot allocate memory|std::bad_alloc", MEMORY_LIMIT),
    (r"DeadKernelError|Kernel died", KERNEL_DIED),
    (
        r"Timeout waiting for IOPub|CellTimeoutError|UnresponsiveKernelError|TimeoutError"
        r"|Timeout waiting for execute reply|Kernel didn't respond",
        TIMEOUT,
    ),
    (r"ValidationError|Notebook JSON is invalid|SchemaTooOld|SchemaTooNew", INVALID_NOTEBOOK),
)

#: Error outputs in an autograded notebook that mean a grading limit cut the student's code
#: short, so the score reflects the limit rather than the work.
LIMIT_ERRORS: dict[str, str] = {"CellTimeoutError": TIMEOUT, "MemoryError": MEMORY_LIMIT}


def classify_failure(text: str) -> tuple[str, str]:
    """The reason a failed autograde gives, read from its log and traceback, and the line that
    says so (the exception line when there is one)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern, reason in _FAILURE_PATTERNS:
        matching = [line for line in lines if re.search(pattern, line)]
        if matching:
            exceptions = [line for line in matching if re.search(r"(Error|Exception)\b.*:", line)]
            return reason, (exceptions or matching)[-1][:300]
    return GRADING_ERROR, last_error_line(text)


def last_error_line(text: str) -> str:
    """The last line of ``text`` that names an exception, for a one-line detail."""
    candidates = [
        line.strip() for line in text.splitlines() if re.search(r"\w(Error|Exception)\b", line)
    ]
    return candidates[-1][:300] if candidates else ""


@dataclass
class RestoredCells:
    """The instructor's cells grading put back: edited ones (restored), deleted ones
    (re-added) and moved ones (put back in the instructor's order)."""

    edited: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.edited or self.deleted or self.moved)

    def describe(self) -> str:
        """E.g. ``edited test_a; deleted test_b; moved helpers``."""
        parts = []
        for what, names in (("edited", self.edited), ("deleted", self.deleted)):
            if names:
                parts.append(f"{what} " + ", ".join(names))
        if self.moved:
            parts.append("moved " + ", ".join(self.moved))
        return "; ".join(parts)


@dataclass
class NotebookOutcome:
    """How one notebook of one submission fared.

    ``graded`` says nbgrader wrote an autograded notebook and its scores; ``reason`` is set when
    the notebook failed (not graded, or graded only after a grading limit cut it short).
    """

    name: str
    submitted: bool = True
    graded: bool = False
    reason: str | None = None
    detail: str = ""
    restored: RestoredCells = field(default_factory=RestoredCells)
    seconds: float = 0.0
    not_as_written: list[str] = field(default_factory=list)
    reaches_into_grader: list[str] = field(default_factory=list)
    kernel_died: str | None = None
    files: list[str] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    #: Why the notebook was graded a second time (its first run hit a time limit, which a
    #: busy machine can cause); the grade and status are the second run's.
    retried: str = ""

    @property
    def failed(self) -> bool:
        """Whether this notebook's score must not be read as a grade."""
        return self.reason is not None

    @property
    def flags(self) -> list[str]:
        """Why the instructor should look at this notebook although it was graded."""
        flags = []
        if self.kernel_died:
            flags.append(f"{KERNEL_DIED} ({self.kernel_died})")
        if self.not_as_written:
            flags.append(f"{NOT_AS_WRITTEN} ({self.not_as_written[0]})")
        if self.reaches_into_grader:
            flags.append(f"{REACHES_INTO_GRADER} ({self.reaches_into_grader[0]})")
        if self.files:
            flags.append(f"{SUBMITTED_FILES} ({self.files[0]})")
        return flags

    @property
    def status(self) -> str:
        """``graded``, ``not submitted``, ``graded: locked cells restored (...)``,
        ``flagged: ...`` or ``failed: ...``."""
        if self.reason is not None:
            return f"failed: {self.reason}"
        if not self.submitted:
            return "not submitted"
        if self.flags:
            return "flagged: " + "; ".join(self.flags)
        if self.restored:
            return f"graded: locked cells restored ({self.restored.describe()})"
        return "graded"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (status included)."""
        record = asdict(self)
        record["status"] = self.status
        record["flags"] = self.flags
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> NotebookOutcome:
        """Inverse of :meth:`to_dict`."""
        fields = {k: v for k, v in record.items() if k not in ("status", "flags")}
        fields["restored"] = RestoredCells(**fields.get("restored", {}))
        return cls(**fields)


@dataclass
class StudentOutcome:
    """One student's submission: the notebooks' outcomes and the wall-clock time it took."""

    student: str
    notebooks: list[NotebookOutcome] = field(default_factory=list)
    seconds: float = 0.0
    worker: int = 0
    log_path: str = ""
    #: Seconds the sandbox took to start, and of those, its zygote's imports.
    sandbox_s: float = 0.0
    imports_s: float = 0.0

    @property
    def failed(self) -> bool:
        """Whether any notebook failed."""
        return any(nb.failed for nb in self.notebooks)

    @property
    def fully_graded(self) -> bool:
        """Whether every submitted notebook has an autograded notebook."""
        return all(nb.graded or not nb.submitted for nb in self.notebooks)

    @property
    def flagged(self) -> bool:
        """Whether any notebook is flagged for the instructor."""
        return any(nb.flags for nb in self.notebooks)

    @property
    def status(self) -> str:
        """The student's line in the summary: the first failure, else flags, else
        restorations, else graded."""
        failures = [nb for nb in self.notebooks if nb.failed]
        if failures:
            reasons: dict[str, list[str]] = {}
            for nb in failures:
                reasons.setdefault(nb.reason or "", []).append(nb.name)
            return "failed: " + "; ".join(f"{r} ({', '.join(n)})" for r, n in reasons.items())
        flagged = [nb for nb in self.notebooks if nb.flags]
        if flagged:
            kinds: dict[str, list[str]] = {}
            for nb in flagged:
                for flag in nb.flags:
                    kinds.setdefault(flag.split(" (")[0], []).append(nb.name)
            return "flagged: " + "; ".join(f"{k} ({', '.join(n)})" for k, n in kinds.items())
        restored = [nb for nb in self.notebooks if nb.restored]
        if restored:
            what = "; ".join(f"{nb.name}: {nb.restored.describe()}" for nb in restored)
            return f"graded: locked cells restored ({what})"
        if self.notebooks and not any(nb.submitted for nb in self.notebooks):
            return "not submitted"
        return "graded"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {
            "student": self.student,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "worker": self.worker,
            "log_path": self.log_path,
            "sandbox_s": round(self.sandbox_s, 3),
            "imports_s": round(self.imports_s, 3),
            "notebooks": [nb.to_dict() for nb in self.notebooks],
        }
