"""The instructor's batch: autograde → generate_feedback → export over everything submitted.

``python -m chainrule.grading batch <assignment>`` (see :mod:`chainrule.grading.__main__`) calls
:func:`run_batch`, which

1. snapshots every submission in ``submitted/*/<assignment>`` (:mod:`.snapshot`) and grades
   the snapshots, each in a child process with a wall-clock and a memory limit, one after
   another or with ``workers`` parallel workers, printing one line per student as it finishes;
   every kernel runs in the bubblewrap sandbox (:mod:`.sandbox`) and the test cells run in the
   grader (:mod:`.execute`). Without bubblewrap the batch refuses to grade unless
   ``sandbox=False`` (``--no-sandbox``), and its summary then says the grades were not isolated;
2. flags failed notebooks in the gradebook for review (:func:`gradebooks.flag_failed`);
3. generates feedback for every graded student with the hidden tests stripped, and removes stale
   feedback of students whose submission could not be graded;
4. writes nbgrader's CSV export, and its own summary (text, CSV, JSON) with a status per student
   and per notebook, into ``grades/<assignment>/`` (logs per student in ``logs/``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from chainrule.grading import scratch, summary
from chainrule.grading.child import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S
from chainrule.grading.config import CourseLayout, grading_env, load_config
from chainrule.grading.export import export_grades
from chainrule.grading.feedback import generate_feedback
from chainrule.grading.gradebooks import assignment_notebooks, flag_failed
from chainrule.grading.grader import Progress, grade_student_safely
from chainrule.grading.outcomes import SNAPSHOT_FAILED, NotebookOutcome, StudentOutcome
from chainrule.grading.parallel import grade_in_parallel
from chainrule.grading.sandbox import sandbox_problem, uses_torch
from chainrule.grading.snapshot import Snapshots, take_snapshots
from chainrule.grading.worker import GradingJob, GradingTarget


@dataclass
class BatchOptions:
    """What to grade and how (the command line's options)."""

    assignment: str
    course_root: Path = Path(".")
    workers: int = 1
    timeout_per_submission: float | None = DEFAULT_TIMEOUT_S
    memory_limit_mb: int | None = DEFAULT_MEMORY_MB
    students: list[str] = field(default_factory=list)
    config_files: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    feedback: bool = True
    sandbox: bool = True


@dataclass
class BatchResult:
    """What a batch produced."""

    outcomes: list[StudentOutcome]
    rows: list[summary.SummaryRow]
    notebooks: list[str]
    out_dir: Path
    export_csv: Path
    summary_csv: Path
    summary_json: Path
    summary_txt: Path
    feedback_errors: dict[str, str] = field(default_factory=dict)
    isolated: bool = True

    @property
    def all_graded(self) -> bool:
        """Whether no notebook failed."""
        return not any(o.failed for o in self.outcomes)


def submitted_students(layout: CourseLayout, assignment: str) -> list[str]:
    """Students with a ``submitted/<student>/<assignment>`` folder, sorted."""
    if not layout.submitted.exists():
        return []
    return sorted(p.name for p in layout.submitted.iterdir() if (p / assignment).is_dir())


def make_job(options: BatchOptions, out_dir: Path, workspaces: Path) -> GradingJob:
    """The shared grading job for this batch."""
    config = load_config(options.course_root, options.config_files, options.overrides)
    layout = CourseLayout.from_config(config)
    notebooks = assignment_notebooks(layout.db_url, layout.course_id, options.assignment)
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    exchange = str(config.Exchange.get("root", "")) if "Exchange" in config else ""
    hidden = [str(layout.root), str(out_dir), *([exchange] if exchange else [])]
    return GradingJob(
        assignment=options.assignment,
        layout=layout,
        config=config,
        notebooks=tuple(notebooks),
        logs=logs,
        env=grading_env(),
        timeout_s=options.timeout_per_submission,
        memory_limit_mb=options.memory_limit_mb,
        snapshots=out_dir / "snapshots",
        workspaces=workspaces,
        isolate=options.sandbox,
        hidden=tuple(hidden),
        preload_torch=uses_torch(layout.source_notebooks(options.assignment)),
    )


class SandboxUnavailable(RuntimeError):
    """Kernels cannot be sandboxed here and ``--no-sandbox`` was not given."""


NOT_ISOLATED = (
    "NOT ISOLATED: graded with --no-sandbox, so the students' code ran unconfined and these "
    "grades cannot be vouched for"
)


def grade_all(
    job: GradingJob, students: Sequence[str], workers: int, progress: Progress
) -> list[StudentOutcome]:
    """Grade ``students`` one after another (``workers <= 1``) or in parallel."""
    if workers > 1 and len(students) > 1:
        if job.layout.db_url.startswith("sqlite:///"):
            return grade_in_parallel(job, students, min(workers, len(students)), progress.report)
        print(
            "parallel grading needs an SQLite gradebook; grading one after another",
            file=progress.stream,
        )
    outcomes = []
    for student in students:
        outcome = grade_student_safely(job, student, GradingTarget())
        progress.report(outcome)
        outcomes.append(outcome)
    return outcomes


def not_copied(job: GradingJob, student: str, error: str) -> StudentOutcome:
    """The outcome of a student whose submission could not be copied: not graded."""
    notebooks = [NotebookOutcome(n, reason=SNAPSHOT_FAILED, detail=error) for n in job.notebooks]
    return StudentOutcome(student, notebooks)


def note_snapshot(outcome: StudentOutcome, snapshots: Snapshots) -> None:
    """Flag, on every notebook of a student, the files their snapshot left out and those named
    like installed modules."""
    snapshot = snapshots.students.get(outcome.student)
    if snapshot is None:
        return
    files = [f"{name} was left out" for name in snapshot.skipped]
    files += [f"{name} is named like an installed module" for name in snapshot.shadowing]
    for notebook in outcome.notebooks:
        notebook.files += files


def refresh_feedback(job: GradingJob, outcomes: Sequence[StudentOutcome]) -> dict[str, str]:
    """Feedback for each fully graded student; stale feedback of the others removed.

    Returns ``{student: error}`` for students whose feedback nbgrader could not generate.
    """
    errors = {}
    for outcome in outcomes:
        folder = job.layout.feedback_dir(outcome.student, job.assignment)
        if folder.exists():
            shutil.rmtree(folder)
        if not outcome.fully_graded or not any(nb.graded for nb in outcome.notebooks):
            continue
        result = generate_feedback(job.config, job.assignment, outcome.student)
        if not result.get("success"):
            errors[outcome.student] = str(result.get("error", ""))[-2000:]
    return errors


# A kernel's IPC sockets are <workspaces>/student-XXXXXXXX/ipc/<notebook>/kernel-N,
# and a Unix socket's path has at most 107 bytes (notebook names of up to 40 characters).
SOCKET_PATH_MAX = 107
SOCKET_PATH_IN_WORKSPACES = len("/student-XXXXXXXX/ipc/") + 40 + len("/kernel-N")


def workspaces_folder() -> Path:
    """A new folder for the private folders of a batch's kernels: in the temporary folder, or in
    ``/tmp`` where the temporary folder's path is too long for the kernels' sockets (a long
    ``TMPDIR``, as on macOS). Held by this process until :func:`scratch.remove`, so a later
    batch removes it if this one is killed."""
    base = tempfile.gettempdir()
    longest = len(str(Path(base) / "chainrule-kernels-XXXXXXXX")) + SOCKET_PATH_IN_WORKSPACES
    if longest > SOCKET_PATH_MAX:
        base = "/tmp"
    return scratch.make("chainrule-kernels-", base)


def run_batch(options: BatchOptions, stream: TextIO | None = None) -> BatchResult:
    """Grade, flag, give feedback, export and summarise one assignment (see the module doc).

    Progress and the summary go to ``stream`` (standard output by default).
    """
    stream = stream or sys.stdout
    if options.sandbox:
        problem = sandbox_problem()
        if problem:
            raise SandboxUnavailable(f"refusing to grade without a sandbox: {problem}")
    root = Path(options.course_root).resolve()
    out_dir = (options.out_dir or root / "grades" / options.assignment).resolve()
    workspaces = workspaces_folder()
    try:
        job = make_job(options, out_dir, workspaces)
    except BaseException:
        scratch.remove(workspaces)
        raise
    students = options.students or submitted_students(job.layout, options.assignment)
    print(
        f"Grading {options.assignment}: {len(students)} submissions, "
        f"{max(1, options.workers)} worker(s), limits {options.timeout_per_submission} s and "
        f"{options.memory_limit_mb} MB per submission, "
        + ("each kernel in a sandbox" if options.sandbox else NOT_ISOLATED),
        file=stream,
        flush=True,
    )
    snapshots = take_snapshots(
        job.layout.submitted, options.assignment, students, job.notebooks, job.snapshots
    )
    copied = [s for s in students if snapshots.students[s].error is None]
    progress = Progress(len(students), stream, max([len(s) for s in students] + [8]))
    try:
        graded = {o.student: o for o in grade_all(job, copied, options.workers, progress)}
    finally:  # a worker killed at its time limit leaves its sandbox's private folder behind
        scratch.remove(job.workspaces)
    return finish_batch(options, job, snapshots, students, graded, progress, stream)


def finish_batch(
    options: BatchOptions,
    job: GradingJob,
    snapshots: Snapshots,
    students: Sequence[str],
    graded: dict[str, StudentOutcome],
    progress: Progress | None = None,
    stream: TextIO | None = None,
) -> BatchResult:
    """The batch's end, once ``graded`` holds the outcome of every student whose submission was
    copied (by this process's graders, or by a task queue's workers): flag, give feedback,
    export and summarise (see the module doc)."""
    stream = stream or sys.stdout
    out_dir = job.logs.parent
    outcomes = []
    for student in students:
        error = snapshots.students[student].error
        outcome = graded[student] if error is None else not_copied(job, student, error)
        if error is not None and progress is not None:
            progress.report(outcome)
        note_snapshot(outcome, snapshots)
        outcomes.append(outcome)
    layout = job.layout
    flag_failed(layout.db_url, layout.course_id, options.assignment, outcomes)
    feedback_errors = refresh_feedback(job, outcomes) if options.feedback else {}
    export_csv = export_grades(job.config, options.assignment, out_dir / "nbgrader-export.csv")
    names, rows = summary.collect_rows(
        layout.db_url, layout.course_id, options.assignment, outcomes
    )
    text = summary.render(options.assignment, names, rows)
    if not options.sandbox:
        text = f"{NOT_ISOLATED}\n{text}"
    for student, error in feedback_errors.items():
        text += f"  feedback for {student} failed: {error.strip().splitlines()[-1:]}\n"
    summary_txt = out_dir / "summary.txt"
    summary_txt.write_text(text)
    print("\n" + text, file=stream, flush=True)
    return BatchResult(
        outcomes=outcomes,
        rows=rows,
        notebooks=names,
        out_dir=out_dir,
        export_csv=export_csv,
        summary_csv=summary.write_csv(rows, out_dir / "summary.csv"),
        summary_json=summary.write_json(rows, options.assignment, out_dir / "summary.json"),
        summary_txt=summary_txt,
        feedback_errors=feedback_errors,
        isolated=options.sandbox,
    )
