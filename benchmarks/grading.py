"""Autograding: where one submission's time goes, against its floor, and a class's throughput.

Everything happens in temporary copies of the course (its ``nbgrader_config.py`` and the
assignment's ``source/``, released there with ``nbgrader generate_assignment``), never in the
repository's own gradebook, ``submitted/`` or ``autograded/``. Submission k is the release with
the instructor's solutions filled in, except that for k ≥ 1 solution cell (k − 1) mod n (of the
n solution cells, counted over the notebooks in order) is left as the student got it, so the
students' grades differ.

- ``grading.parts.<assignment>``: one instructor submission of each assignment, graded by a
  fresh ``python -m chainrule.grading batch <assignment> --no-feedback``; the row's time is the
  student's wall time in the batch and its parts (from the batch's ``summary.json``) are the
  sandbox's start (of which its zygote's imports), and per notebook the kernel's start, the
  student's cells, the judge's own work, the kernel's answers to the judge's requests, the gloo
  worlds those requests started (each world's processes and process group) and
  nbgrader's steps (reading, restoring, saving to the gradebook, writing the notebook). The
  baseline is the **floor**: one fresh interpreter that runs every code cell of the instructor's
  notebooks once, in order (solutions, helpers and tests, hidden ones included), which is the
  work the grade rests on without any grading machinery.
- ``grading.batch``: a batch of ``check_yourself`` submissions, sequential and with 2 workers,
  with identical grades; ``grading.class``: the 2-worker batch's time per student times 1,000.
- ``grading.sandbox``: the sequential batch with every kernel in bubblewrap against the same
  batch with ``--no-sandbox``, with identical grades.

Beside the batches, :func:`two_process_throughput` measures the machine's own ceiling for any
2-worker speedup: how much more pure-Python CPU work two processes do at once than one, just
before the sequential batch and just after the 2-worker one.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from benchmarks.harness import REPO, Row, bench_env, fresh_python, make_row

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


def prepare_course(
    root: Path, notebooks: Sequence[str] | None = None, assignment: str = ASSIGNMENT
) -> Path:
    """A course under ``root`` with ``assignment`` generated into its own gradebook.

    ``notebooks``: only these of the assignment's notebooks (names without ``.ipynb``; default
    all of them), for a smaller course.
    """
    course = root / "course"
    (course / "source").mkdir(parents=True)
    shutil.copy2(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    source = REPO / "source" / assignment
    keep = None if notebooks is None else {f"{name}.ipynb" for name in notebooks}

    def ignore(folder: str, names: list[str]) -> list[str]:
        if keep is None or Path(folder) != source:
            return []
        return [n for n in names if n.endswith(".ipynb") and n not in keep]

    shutil.copytree(source, course / "source" / assignment, ignore=ignore)
    proc = _run(["-m", "nbgrader", "generate_assignment", assignment, "--force"], course, 900)
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


def solution_cells(course: Path, assignment: str = ASSIGNMENT) -> int:
    """The number of code solution cells over the assignment's notebooks."""
    notebooks = (course / "source" / assignment).glob("*.ipynb")
    return sum(_is_solution(cell) for path in notebooks for cell in nbformat.read(path, 4).cells)


def write_submissions(course: Path, count: int, assignment: str = ASSIGNMENT) -> list[str]:
    """Students ``s00``... in ``submitted/``; see the module docstring for what they answer."""
    students = []
    notebooks = sorted((course / "source" / assignment).glob("*.ipynb"))
    for k in range(count):
        student = f"s{k:02d}"
        folder = course / "submitted" / student / assignment
        folder.mkdir(parents=True)
        index = 0
        skipped = None if k == 0 else (k - 1) % solution_cells(course, assignment)
        for source_path in notebooks:
            source = nbformat.read(source_path, as_version=4)
            answers = {
                _grade_id(c): instructor_code(c.source) for c in source.cells if _is_solution(c)
            }
            nb = nbformat.read(course / "release" / assignment / source_path.name, as_version=4)
            for cell in nb.cells:
                if _is_solution(cell):
                    if index != skipped:
                        cell.source = answers[_grade_id(cell)]
                    index += 1
            nbformat.write(nb, folder / source_path.name)
        students.append(student)
    return students


def grade_batch(
    course: Path,
    workers: int,
    students: list[str] | None = None,
    sandbox: bool = True,
    assignment: str = ASSIGNMENT,
) -> tuple[float, Grades]:
    """Wall seconds of one ``chainrule.grading batch`` run, and the grades it recorded (its
    ``summary.json`` is in ``course/grades/workers-<workers>``)."""
    out = course / "grades" / f"workers-{workers}"
    args = ["-m", "chainrule.grading", "batch", assignment, "--course-root", str(course)]
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


#: Runs every code cell of an assignment's source notebooks in one fresh interpreter (argv: the
#: assignment's source folder): the floor of grading it.
FLOOR_SCRIPT = """
import linecache, sys
from pathlib import Path
import nbformat
for path in sorted(Path(sys.argv[1]).glob("*.ipynb")):
    namespace = {"__name__": "__main__"}
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "code":
            name = f"<{path.stem} cell {index}>"  # as IPython does: the cell's own source
            lines = cell.source.splitlines(True)
            linecache.cache[name] = (len(cell.source), None, lines, name)
            exec(compile(cell.source, name, "exec"), namespace)
"""

#: The parts of one notebook's grading the batch records, in the order the report lists them.
NOTEBOOK_PARTS = (
    "kernel start",
    "student cells",
    "judge",
    "kernel requests",
    "gloo world starts",
    "nbgrader",
)


def floor_seconds(course: Path, assignment: str) -> float:
    """Wall seconds of one fresh interpreter running every code cell of the assignment's
    source notebooks once (see :data:`FLOOR_SCRIPT`), in a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="floor-") as scratch:
        seconds, _ = fresh_python(
            FLOOR_SCRIPT,
            str(course / "source" / assignment),
            cwd=scratch,
            what=f"the floor of {assignment}",
            timeout=900,
        )
    return seconds


def student_parts(summary_json: Path, student: str) -> tuple[float, dict[str, float], str]:
    """One student's wall seconds in a batch, its parts summed over the notebooks (plus the
    sandbox's start, its imports, and what lies outside any notebook), and its status."""
    record = next(
        r for r in json.loads(summary_json.read_text())["students"] if r["student"] == student
    )
    parts = {"sandbox start": float(record.get("sandbox_s", 0.0))}
    parts["of which imports"] = float(record.get("imports_s", 0.0))
    for name in NOTEBOOK_PARTS:
        parts[name] = sum(float(nb.get("parts", {}).get(name, 0.0)) for nb in record["notebooks"])
    notebooks_s = sum(float(nb.get("seconds", 0.0)) for nb in record["notebooks"])
    parts["outside notebooks"] = max(0.0, record["seconds"] - parts["sandbox start"] - notebooks_s)
    parts["cpu in the sandbox"] = sum(
        float(nb.get("parts", {}).get("cpu", 0.0)) for nb in record["notebooks"]
    )
    return float(record["seconds"]), parts, record["status"]


def measure_parts(tmp: Path, assignment: str, notebooks: Sequence[str] | None = None) -> Row:
    """The row ``grading.parts.<assignment>``: one instructor submission against the floor
    (``notebooks``: only these notebooks of the assignment).

    The batch grades the instructor's submission twice, as two students, one after the other:
    the row is the second one, what each student of a class costs. The first also pays what a
    batch pays once (its fork server's imports), reported beside it.
    """
    course = prepare_course(tmp / f"parts-{assignment}", notebooks, assignment)
    first = write_submissions(course, 1, assignment)[0]
    second = f"{first}b"
    shutil.copytree(course / "submitted" / first, course / "submitted" / second)
    floor = floor_seconds(course, assignment)
    grade_batch(course, 1, [first, second], assignment=assignment)
    summary = course / "grades" / "workers-1" / "summary.json"
    first_s, _, _ = student_parts(summary, first)
    seconds, parts, status = student_parts(summary, second)
    notebooks = len(list((course / "release" / assignment).glob("*.ipynb")))
    return make_row(
        f"grading.parts.{assignment}",
        f"one instructor submission of {assignment} ({notebooks} notebooks)",
        seconds,
        floor,
        "the floor: one interpreter running the notebooks' code once",
        seconds / floor,
        graded=status == "graded",
        **{name: round(value, 2) for name, value in parts.items()},
        **{"the batch's first student": round(first_s, 2)},
    )


def _spin(n: int, ready: Any, start: Any, out: Any) -> None:
    ready.put(True)
    start.wait()
    began, total = time.perf_counter(), 0
    for i in range(n):
        total += i * i
    out.put(time.perf_counter() - began)


def two_process_throughput(n: int = 6_000_000) -> float:
    """How many times one process's pure-Python CPU work two processes do at once here: 2.0 on
    two free cores, less where the two CPUs are hyperthreads of one core, or where the host or
    other work takes its share. No 2-worker batch beside it can speed up more."""
    context = multiprocessing.get_context("spawn")

    def seconds_each(count: int) -> list[float]:
        ready, start, out = context.Queue(), context.Event(), context.Queue()
        processes = [
            context.Process(target=_spin, args=(n, ready, start, out)) for _ in range(count)
        ]
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=60)
        start.set()
        times = [out.get(timeout=600) for _ in processes]
        for process in processes:
            process.join()
        return times

    one = seconds_each(1)[0]
    return 2 * one / max(seconds_each(2))


def class_terms(batch_s: float, out: Path, workers: int) -> tuple[float, float]:
    """A batch's time as ``(per student, once per batch)``: the students' own wall times,
    ``workers`` at a time, and the rest (the batch command's start, its fork server, the
    exports), which a class of any size pays once."""
    records = json.loads((out / "summary.json").read_text())["students"]
    per_student = sum(float(r["seconds"]) for r in records) / workers / len(records)
    return per_student, max(0.0, batch_s - per_student * len(records))


def measure(
    quick: bool = False,
    submissions: int | None = None,
    notebooks: Sequence[str] | None = None,
    assignments: Sequence[str] = ("check_yourself", "sharded", "training", "pipeline"),
    sandboxed: bool = True,
) -> list[Row]:
    """Each assignment's parts against its floor, then the ``check_yourself`` batch.

    ``submissions``: the batch size (default 8, 3 when ``quick``); ``notebooks``: grade only
    these notebooks of ``check_yourself`` (default all five); ``assignments``: the
    assignments whose parts are measured (``quick``: ``check_yourself`` only). The batch runs
    sequentially, then with 2 workers; the sequential batch is also run with ``--no-sandbox``
    (``sandboxed``), right after the sandboxed one, with the same submissions.
    """
    count = submissions or (3 if quick else 8)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        for assignment in assignments[:1] if quick else assignments:
            only = notebooks if assignment == ASSIGNMENT else None
            rows.append(measure_parts(Path(tmp), assignment, only))
        template = prepare_course(Path(tmp) / "template", notebooks)
        write_submissions(template, count)
        batches = []
        ceiling_before = two_process_throughput()
        kinds = [(1, True), *([(1, False)] if sandboxed else []), (2, True)]
        seconds = {}
        for workers, isolate in kinds:
            copy = Path(tmp) / f"batch-{workers}-{'sandbox' if isolate else 'plain'}"
            shutil.copytree(template, copy)
            elapsed, grades = grade_batch(copy, workers, sandbox=isolate)
            seconds[(workers, isolate)] = elapsed
            batches.append((f"{workers} worker(s), sandbox {isolate}", copy, grades))
        ceiling_after = two_process_throughput()
        differences = [d for other in batches[1:] for d in grade_differences(batches[0], other)]
        per_student, once = class_terms(
            seconds[(2, True)], batches[-1][1] / "grades" / "workers-2", 2
        )
    identical = not differences
    noted = {"differences": "; ".join(differences)} if differences else {}
    sequential_s, parallel_s = seconds[(1, True)], seconds[(2, True)]
    if sandboxed:
        plain_s = seconds[(1, False)]
        rows.append(
            make_row(
                "grading.sandbox",
                f"batch of {count} submissions, sequential, every kernel in bubblewrap",
                sequential_s,
                plain_s,
                "the same batch with --no-sandbox",
                sequential_s / plain_s,
                per_student_sandboxed_s=sequential_s / count,
                per_student_unsandboxed_s=plain_s / count,
                identical_grades=identical,
                **noted,
            )
        )
    rows.append(
        make_row(
            "grading.batch",
            f"batch of {count} submissions: sequential / 2 workers",
            sequential_s,
            parallel_s,
            "the same batch with 2 workers",
            sequential_s / parallel_s,
            speedup=sequential_s / parallel_s,
            per_student_s=sequential_s / count,
            identical_grades=identical,
            all_graded=all(all_graded(grades) for _, _, grades in batches),
            distinct_grades=distinct_grades(batches[0][2]),
            submissions=count,
            machine_two_processes_before=ceiling_before,
            machine_two_processes_after=ceiling_after,
            **noted,
        )
    )
    rows.append(
        make_row(
            "grading.class",
            "a class of 1,000 check_yourself submissions with 2 workers (projected)",
            once + per_student * 1000,
            per_student_2_workers_s=per_student,
            once_per_batch_s=once,
        )
    )
    return rows
