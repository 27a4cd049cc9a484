"""Autograding throughput of ``check_yourself``: one student, and a batch with 1 and 2 workers.

Everything happens in a temporary copy of the course (its ``nbgrader_config.py`` and
``source/check_yourself``, released there with ``nbgrader generate_assignment``), never in the
repository's own gradebook, ``submitted/`` or ``autograded/``. Submission k is the release with
the instructor's solutions filled in, except that for k ≥ 1 solution cell (k − 1) mod n (of the
n solution cells, counted over the notebooks in order) is left as the student got it, so the
students' grades differ.

Each measurement is a fresh ``python -m chainrule.grading batch check_yourself --no-feedback``
on its own copy of the generated course (feedback generation is sequential and not part of
autograding). The batch with 2 workers must give every student exactly the grades of the
sequential batch (the ``identical_grades`` field). The sandbox's cost is measured the same way:
sequential batches with every kernel in bubblewrap against batches with ``--no-sandbox``,
alternated, with identical grades.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from benchmarks.harness import REPO, Row, bench_env, make_row

ASSIGNMENT = "check_yourself"
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")

Grades = dict[str, dict[str, Any]]


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def prepare_course(root: Path, notebooks: Sequence[str] | None = None) -> Path:
    """A course under ``root`` with ``check_yourself`` generated into its own gradebook.

    ``notebooks``: only these of the assignment's notebooks (names without ``.ipynb``; default
    all five), for a smaller course.
    """
    course = root / "course"
    (course / "source").mkdir(parents=True)
    shutil.copy2(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    source = REPO / "source" / ASSIGNMENT
    keep = None if notebooks is None else {f"{name}.ipynb" for name in notebooks}

    def ignore(folder: str, names: list[str]) -> list[str]:
        if keep is None or Path(folder) != source:
            return []
        return [n for n in names if n.endswith(".ipynb") and n not in keep]

    shutil.copytree(source, course / "source" / ASSIGNMENT, ignore=ignore)
    proc = _run(["-m", "nbgrader", "generate_assignment", ASSIGNMENT, "--force"], course, 900)
    if proc.returncode != 0:
        raise RuntimeError(f"generate_assignment failed:\n{proc.stderr[-4000:]}")
    return course


def _is_solution(cell: nbformat.NotebookNode) -> bool:
    flags = cell.get("metadata", {}).get("nbgrader", {})
    return cell.cell_type == "code" and bool(flags.get("solution"))


def _grade_id(cell: nbformat.NotebookNode) -> str:
    return cell["metadata"]["nbgrader"]["grade_id"]


def instructor_code(source: str) -> str:
    """A source solution cell's code without nbgrader's solution markers."""
    lines = [line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS]
    return "\n".join(lines)


def solution_cells(course: Path) -> int:
    """The number of code solution cells over the assignment's notebooks."""
    notebooks = (course / "source" / ASSIGNMENT).glob("*.ipynb")
    return sum(_is_solution(cell) for path in notebooks for cell in nbformat.read(path, 4).cells)


def write_submissions(course: Path, count: int) -> list[str]:
    """Students ``s00``... in ``submitted/``; see the module docstring for what they answer."""
    students = []
    notebooks = sorted((course / "source" / ASSIGNMENT).glob("*.ipynb"))
    for k in range(count):
        student = f"s{k:02d}"
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        index = 0
        skipped = None if k == 0 else (k - 1) % solution_cells(course)
        for source_path in notebooks:
            source = nbformat.read(source_path, as_version=4)
            answers = {
                _grade_id(c): instructor_code(c.source) for c in source.cells if _is_solution(c)
            }
            nb = nbformat.read(course / "release" / ASSIGNMENT / source_path.name, as_version=4)
            for cell in nb.cells:
                if _is_solution(cell):
                    if index != skipped:
                        cell.source = answers[_grade_id(cell)]
                    index += 1
            nbformat.write(nb, folder / source_path.name)
        students.append(student)
    return students


def grade_batch(
    course: Path, workers: int, students: list[str] | None = None, sandbox: bool = True
) -> tuple[float, Grades]:
    """Wall seconds of one ``chainrule.grading batch`` run, and the grades it recorded."""
    out = course / "grades" / f"workers-{workers}"
    args = ["-m", "chainrule.grading", "batch", ASSIGNMENT, "--course-root", str(course)]
    args += ["--workers", str(workers), "--no-feedback", "--out", str(out)]
    if not sandbox:
        args.append("--no-sandbox")
    for student in students or []:
        args += ["--student", student]
    start = time.perf_counter()
    proc = _run(args, course, 3600)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 3) or not (out / "summary.json").exists():
        raise RuntimeError(f"grading batch failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    return seconds, read_grades(out / "summary.json")


def read_grades(summary_json: Path) -> Grades:
    """``{student: {"status", "total", notebook: score...}}`` from the batch's summary."""
    grades: Grades = {}
    for record in json.loads(summary_json.read_text())["students"]:
        entry: dict[str, Any] = {"status": record["status"], "total": record["total"]}
        for nb in record["notebooks"]:
            entry[nb["name"]] = (nb["status"], nb["gradebook_score"])
        grades[record["student"]] = entry
    return grades


def failing_tests(course: Path, student: str, notebook: str) -> list[str]:
    """The test cells that raised in a student's autograded notebook: ``id: Error: message``."""
    path = course / "autograded" / student / ASSIGNMENT / f"{notebook}.ipynb"
    if not path.exists():
        return ["no autograded notebook"]
    failures = []
    for cell in nbformat.read(path, as_version=4).cells:
        flags = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not flags.get("grade") or flags.get("solution"):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                message = (output.get("evalue") or "").strip().splitlines()[:1]
                failures.append(f"{flags['grade_id']}: {output['ename']}: {''.join(message)[:200]}")
    return failures


def grade_differences(
    first: tuple[str, Path, Grades], second: tuple[str, Path, Grades], same_students: bool = True
) -> list[str]:
    """Each notebook graded differently by two batches ``(name, course, grades)``, with the
    test cells that failed in each; with ``same_students``, also students only one graded."""
    (name_a, course_a, grades_a), (name_b, course_b, grades_b) = first, second
    differences = []
    for student in sorted(set(grades_a) & set(grades_b)):
        a, b = grades_a[student], grades_b[student]
        for notebook in sorted(k for k in a.keys() | b.keys() if k not in ("status", "total")):
            if a.get(notebook) != b.get(notebook):
                differences.append(
                    f"{student}/{notebook}: {name_a} {a.get(notebook)} "
                    f"{failing_tests(course_a, student, notebook)} vs {name_b} "
                    f"{b.get(notebook)} {failing_tests(course_b, student, notebook)}"
                )
    missing = set(grades_a) ^ set(grades_b) if same_students else set()
    differences += [f"{student}: graded by only one batch" for student in sorted(missing)]
    return differences


def all_graded(grades: Grades) -> bool:
    """Whether every student has a total (no notebook failed to grade)."""
    return all(entry["total"] is not None for entry in grades.values())


def distinct_grades(grades: Grades) -> int:
    """How many different score sheets (per-notebook scores) the students got."""
    return len({tuple(sorted(entry.items())) for entry in grades.values()})


def measure(
    quick: bool = False,
    submissions: int | None = None,
    notebooks: Sequence[str] | None = None,
    single: bool = True,
    rounds: int | None = None,
    sandboxed: bool = True,
) -> list[Row]:
    """One student alone, then the batch sequential and with 2 workers, each on its own copy.

    ``submissions``: the batch size (default 20, 3 when ``quick``); ``notebooks``: grade only
    these notebooks of the assignment (default all five); ``single``: also time one student
    on a course of their own (the row ``grading.single``); ``rounds``: batches of each kind
    (default 2, 1 when ``quick``), run in the order sequential, 2 workers, 2 workers,
    sequential...: a machine that drifts slower or faster during the measurement (this one
    does, by tens of percent) then weighs on both kinds alike. The speedup is the total time of
    the sequential batches over that of the parallel ones. ``sandboxed``: also time sequential
    batches without the sandbox, alternated with the sandboxed ones (the row
    ``grading.sandbox``: sandboxed over unsandboxed time).
    """
    count = submissions or (3 if quick else 20)
    rounds = rounds or (1 if quick else 2)
    order = [w for r in range(rounds) for w in ((1, 2) if r % 2 == 0 else (2, 1))]
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        template = prepare_course(Path(tmp) / "template", notebooks)
        students = write_submissions(template, count)
        notebook_count = len(list((template / "release" / ASSIGNMENT).glob("*.ipynb")))
        seconds: dict[int, list[float]] = {1: [], 2: []}
        batches = []
        for index, workers in enumerate(order):
            copy = Path(tmp) / f"batch-{index}-workers-{workers}"
            shutil.copytree(template, copy)
            elapsed, grades = grade_batch(copy, workers)
            seconds[workers].append(elapsed)
            batches.append((f"batch {index + 1} ({workers} worker(s))", copy, grades))
        reference = batches[0]
        differences = []
        for other in batches[1:]:
            differences += grade_differences(reference, other)
        sandbox_s: dict[bool, list[float]] = {True: [], False: []}
        sandbox_differences: list[str] = []
        if sandboxed:
            plain = []
            for index, isolate in enumerate([False, True, True, False][: 2 * rounds]):
                copy = Path(tmp) / f"sandbox-{index}-{isolate}"
                shutil.copytree(template, copy)
                elapsed, grades = grade_batch(copy, 1, sandbox=isolate)
                sandbox_s[isolate].append(elapsed)
                plain.append((f"batch {'in' if isolate else 'without'} the sandbox", copy, grades))
            sandbox_differences = [
                d for other in plain for d in grade_differences(reference, other)
            ]
        if single:
            copy = Path(tmp) / "single"
            shutil.copytree(template, copy)
            single_s, alone = grade_batch(copy, 1, students[:1])
            differences += grade_differences(
                ("single", copy, alone), reference, same_students=False
            )
    identical = not differences
    sequential_s, parallel_s = sum(seconds[1]), sum(seconds[2])
    rows = []
    if sandboxed:
        inside, outside = sum(sandbox_s[True]), sum(sandbox_s[False])
        each = len(sandbox_s[True])
        rows.append(
            make_row(
                "grading.sandbox",
                f"batch of {count} submissions, sequential, every kernel in bubblewrap",
                inside / each,
                outside / each,
                "the same batch with --no-sandbox",
                inside / outside,
                per_student_sandboxed_s=inside / each / count,
                per_student_unsandboxed_s=outside / each / count,
                identical_grades=not sandbox_differences,
                **({"differences": "; ".join(sandbox_differences)} if sandbox_differences else {}),
            )
        )
    if single:
        rows.append(
            make_row(
                "grading.single",
                f"autograde one student's {ASSIGNMENT} ({notebook_count} notebooks), one batch",
                single_s,
                all_graded=all_graded(alone),
            )
        )
    rows.append(
        make_row(
            "grading.batch",
            f"batch of {count} submissions: sequential / 2 workers",
            sequential_s / rounds,
            parallel_s / rounds,
            "the same batch with 2 workers",
            sequential_s / parallel_s,
            speedup=sequential_s / parallel_s,
            speedups=", ".join(f"{a / b:.2f}" for a, b in zip(seconds[1], seconds[2], strict=True)),
            per_student_s=sequential_s / rounds / count,
            identical_grades=identical,
            all_graded=all(all_graded(grades) for _, _, grades in batches),
            distinct_grades=distinct_grades(reference[2]),
            submissions=count,
            batches=len(order),
            **({"differences": "; ".join(differences)} if differences else {}),
        )
    )
    return rows
