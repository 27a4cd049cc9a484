"""The grading summary: per student and per notebook, real scores apart from failures.

Each row joins a student's :class:`~chainrule.grading.outcomes.StudentOutcome` with the scores
the gradebook holds. A failed notebook shows ``FAILED`` instead of a number and a student with
any failed notebook has no total: nbgrader's export would show 0 for both, like a real zero.
Written three ways: a terminal table, CSV (one row per student and notebook) and JSON.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbgrader.api import Gradebook, MissingEntry

from chainrule.grading.outcomes import StudentOutcome

STATUS_WIDTH = 46


@dataclass
class NotebookScore:
    """One notebook's score as the gradebook holds it (``None`` when there is none)."""

    score: float | None
    max_score: float


@dataclass
class SummaryRow:
    """One student: the outcome and the gradebook's scores per notebook."""

    outcome: StudentOutcome
    scores: dict[str, NotebookScore] = field(default_factory=dict)
    max_score: float = 0.0

    @property
    def total(self) -> float | None:
        """The total score, or ``None`` when a notebook failed (there is no grade to add up)."""
        if self.outcome.failed:
            return None
        return sum(s.score or 0.0 for s in self.scores.values())


def collect_rows(
    db_url: str, course_id: str, assignment: str, outcomes: Sequence[StudentOutcome]
) -> tuple[list[str], list[SummaryRow]]:
    """The assignment's notebook names and one row per outcome, scores read from the gradebook."""
    rows = []
    with Gradebook(db_url, course_id) as gb:
        nb_records = gb.find_assignment(assignment).notebooks
        names = [nb.name for nb in nb_records]
        max_scores = {nb.name: nb.max_score for nb in nb_records}
        for outcome in outcomes:
            row = SummaryRow(outcome, max_score=sum(max_scores.values()))
            for name in names:
                try:
                    score = gb.find_submission_notebook(name, assignment, outcome.student).score
                except MissingEntry:
                    score = None
                row.scores[name] = NotebookScore(score, max_scores[name])
            rows.append(row)
    return names, rows


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def notebook_cell(row: SummaryRow, name: str) -> str:
    """What the table shows for one notebook: ``2/3``, ``FAILED`` or ``not submitted``."""
    outcome = next((nb for nb in row.outcome.notebooks if nb.name == name), None)
    if outcome is None or outcome.failed:
        return "FAILED"
    if not outcome.submitted:
        return "missing"
    score = row.scores[name]
    mark = "!" if outcome.flags else "*" if outcome.restored else ""
    return f"{_number(score.score)}/{score.max_score:g}{mark}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return lines


def student_table(names: Sequence[str], rows: Sequence[SummaryRow]) -> list[str]:
    """Per student: status, total, each notebook, seconds."""
    header = ["student", "status", "total", *names, "time"]
    body = []
    for row in rows:
        total = "—" if row.total is None else f"{row.total:g}/{row.max_score:g}"
        cells = [notebook_cell(row, name) for name in names]
        status = _clip(row.outcome.status, STATUS_WIDTH)
        body.append([row.outcome.student, status, total, *cells, f"{row.outcome.seconds:.1f}s"])
    return _table(header, body)


def notebook_table(names: Sequence[str], rows: Sequence[SummaryRow]) -> list[str]:
    """Per notebook: how many were graded, restored, failed, missing, and the mean graded score."""
    header = ["notebook", "graded", "restored", "failed", "missing", "mean of graded"]
    body = []
    for name in names:
        outcomes = [(row, nb) for row in rows for nb in row.outcome.notebooks if nb.name == name]
        graded = [(r, nb) for r, nb in outcomes if nb.submitted and not nb.failed]
        scores = [r.scores[name].score or 0.0 for r, _ in graded]
        max_score = rows[0].scores[name].max_score if rows else 0.0
        mean = f"{sum(scores) / len(scores):.2f}/{max_score:g}" if scores else "—"
        body.append(
            [
                name,
                str(len(graded)),
                str(sum(1 for _, nb in graded if nb.restored)),
                str(sum(1 for _, nb in outcomes if nb.failed)),
                str(sum(1 for _, nb in outcomes if not nb.submitted)),
                mean,
            ]
        )
    return _table(header, body)


def problem_lines(rows: Sequence[SummaryRow]) -> list[str]:
    """One line per failed, flagged or restored notebook, with the whole reason."""
    lines = []
    for row in rows:
        for nb in row.outcome.notebooks:
            if nb.failed or nb.restored:
                detail = f" — {nb.detail}" if nb.detail else ""
                lines.append(f"  {row.outcome.student}/{nb.name}: {nb.status}{detail}")
            for reason in nb.not_as_written:
                lines.append(
                    f"  {row.outcome.student}/{nb.name}: test did not run as written: {reason}"
                )
            for reason in nb.reaches_into_grader:
                lines.append(f"  {row.outcome.student}/{nb.name}: {reason}")
    return lines


def render(assignment: str, names: Sequence[str], rows: Sequence[SummaryRow]) -> str:
    """The whole summary as terminal text."""
    failed = sum(1 for row in rows if row.outcome.failed)
    flagged = sum(1 for row in rows if row.outcome.flagged and not row.outcome.failed)
    lines = [
        f"Grading summary for {assignment}: {len(rows)} submissions, "
        f"{len(rows) - failed} graded ({flagged} of them flagged for review), "
        f"{failed} with notebooks NOT graded",
        "",
        *student_table(names, rows),
        "",
        *notebook_table(names, rows),
        "",
        "FAILED = not graded (nbgrader's export shows 0); — = no total; "
        "* = graded with locked cells restored; ! = graded and flagged (see Details)",
    ]
    problems = problem_lines(rows)
    if problems:
        lines += ["", "Details:", *problems]
    return "\n".join(lines) + "\n"


def to_records(rows: Sequence[SummaryRow]) -> list[dict[str, Any]]:
    """JSON-ready records: the outcome plus scores."""
    records = []
    for row in rows:
        record = row.outcome.to_dict()
        record["total"] = row.total
        record["max_score"] = row.max_score
        for nb in record["notebooks"]:
            score = row.scores.get(nb["name"])
            nb["gradebook_score"] = None if score is None else score.score
            nb["max_score"] = None if score is None else score.max_score
        records.append(record)
    return records


def write_json(rows: Sequence[SummaryRow], assignment: str, path: Path) -> Path:
    """The summary as JSON: ``{"assignment", "students": [...]}``."""
    path.write_text(json.dumps({"assignment": assignment, "students": to_records(rows)}, indent=1))
    return path


def write_csv(rows: Sequence[SummaryRow], path: Path) -> Path:
    """One CSV row per student and notebook: status, reason, score (empty when not a grade)."""
    fields = ["student", "student_status", "notebook", "status", "score", "max_score", "detail"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            for nb in row.outcome.notebooks:
                score = row.scores.get(nb.name)
                trusted = score is not None and not nb.failed
                writer.writerow(
                    {
                        "student": row.outcome.student,
                        "student_status": row.outcome.status,
                        "notebook": nb.name,
                        "status": nb.status,
                        "score": "" if score is None or not trusted else _number(score.score),
                        "max_score": "" if score is None else f"{score.max_score:g}",
                        "detail": nb.detail,
                    }
                )
    return path
