"""Every assignment (``assignment_fixtures.ASSIGNMENTS``): its release is generated from its
source, and both are sound.

The release must be exactly what ``nbgrader generate_assignment <assignment> --force`` makes of
``source/`` now; the notebooks must carry proper nbgrader metadata; no solution, hidden test or
rubric may reach the students; every test cell must call the student's code.
"""

from __future__ import annotations

import ast
import json
import re

import pytest
from assignment_fixtures import (
    ASSIGNMENTS,
    grade_id,
    is_code_solution,
    is_test,
    is_written_answer,
    read_notebook,
)

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
NOTEBOOKS = [(a, name) for a in ASSIGNMENTS for name in a.notebooks]


def _ids(value):
    return f"{value[0]}-{value[1]}" if isinstance(value, tuple) else str(value)


def files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_check_yourself_has_one_notebook_per_check_yourself_item():
    check_yourself = ASSIGNMENTS[0]
    assert check_yourself.name == "check_yourself" and len(check_yourself.notebooks) == 5


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_the_assignment_holds_only_its_notebooks(assignment):
    assert files(assignment.source_dir) == [f"{name}.ipynb" for name in assignment.notebooks]
    assert assignment.notebooks and all(n.startswith("ex") for n in assignment.notebooks)


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_release_equals_a_fresh_generate_assignment(tmp_path, assignment):
    course = assignment.make_course(tmp_path)
    fresh = course / "release" / assignment.name
    hint = f"run `make release ASSIGNMENT={assignment.name}`"
    assert files(assignment.release_dir) == files(fresh), hint
    for name in files(fresh):
        committed = json.loads((assignment.release_dir / name).read_text())
        generated = json.loads((fresh / name).read_text())
        assert committed == generated, f"release/{assignment.name}/{name} is stale: {hint}"


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_notebooks_are_stored_without_outputs(key):
    assignment, name = key
    for folder in (assignment.source_dir, assignment.release_dir):
        for cell in read_notebook(folder / f"{name}.ipynb").cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, grade_id(cell)


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_cells_carry_nbgrader_metadata(key):
    assignment, name = key
    nb = read_notebook(assignment.source_dir / f"{name}.ipynb")
    ids = [grade_id(c) for c in nb.cells]
    assert None not in ids and len(ids) == len(set(ids))
    for cell in nb.cells:
        flags = cell.metadata["nbgrader"]
        assert flags["schema_version"] == 3 and flags["task"] is False
        if flags["grade"]:
            assert flags["points"] > 0, grade_id(cell)
        if not flags["solution"]:
            assert flags["locked"], f"{grade_id(cell)}: statements and tests are locked"
    tests = [c for c in nb.cells if is_test(c)]
    assert len(tests) >= 2 and any(is_code_solution(c) for c in nb.cells)
    for cell in tests:
        assert HIDDEN.search(cell.source), f"{grade_id(cell)} has no hidden tests"
        hidden = "".join(HIDDEN.findall(cell.source))  # a cell may have several hidden blocks
        assert "default_rng(" in hidden or "seed=" in cell.source
    written = [c for c in nb.cells if is_written_answer(c)]
    assert len(written) == 1, "every exercise has one written part, graded by hand"
    for cell in written:
        assert "**Rubric (" in cell.source, "the instructor version keeps a rubric"


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_release_keeps_solutions_hidden_tests_and_rubrics_from_students(key):
    assignment, name = key
    source = read_notebook(assignment.source_dir / f"{name}.ipynb")
    release = read_notebook(assignment.release_dir / f"{name}.ipynb")
    assert [grade_id(c) for c in release.cells] == [grade_id(c) for c in source.cells]
    text = "\n".join(c.source for c in release.cells)
    for secret in ("BEGIN SOLUTION", "HIDDEN TESTS", "Rubric", *_hidden_lines(source)):
        assert secret not in text
    for cell in release.cells:
        if is_code_solution(cell):
            assert "raise NotImplementedError()" in cell.source
        if is_written_answer(cell):
            assert cell.source == "YOUR ANSWER HERE"


def _hidden_lines(notebook):
    """The lines of the hidden tests that stand nowhere else in the instructor's version."""
    hidden, shown = set(), set()
    for cell in notebook.cells:
        for block in HIDDEN.findall(cell.source):
            hidden |= set(block.splitlines())
        shown |= set(HIDDEN.sub("", cell.source).splitlines())
    return sorted(line for line in hidden - shown if len(line.strip()) > 12)


def _defined_names(sources):
    """Names that code binds at top level: functions, classes and assigned variables."""
    names = set()
    for source in sources:
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            for target in getattr(node, "targets", []):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _used_names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_every_visible_test_uses_the_students_code(key):
    """Static half of 'no test passes on the blank notebook' (the grading tests run it):
    every test cell's visible code reaches a name the student defines, directly or through
    a helper function of a locked cell."""
    assignment, name = key
    source = read_notebook(assignment.source_dir / f"{name}.ipynb")
    student_names = _defined_names(c.source for c in source.cells if is_code_solution(c))
    helper_uses = {}
    for cell in source.cells:
        if cell.cell_type == "code" and not is_code_solution(cell):
            for node in ast.parse(HIDDEN.sub("", cell.source)).body:
                if isinstance(node, ast.FunctionDef):
                    helper_uses[node.name] = _used_names(node)
    release = read_notebook(assignment.release_dir / f"{name}.ipynb")
    for cell in release.cells:
        if not is_test(cell):
            continue
        reached, todo = set(), _used_names(ast.parse(cell.source))
        while todo:
            used = todo.pop()
            if used not in reached:
                reached.add(used)
                todo |= helper_uses.get(used, set())
        assert reached & student_names, f"{grade_id(cell)} never calls the student's code"


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_fixtures_cover_every_exercise(key):
    assignment, name = key
    source = read_notebook(assignment.source_dir / f"{name}.ipynb")
    solutions = {grade_id(c) for c in source.cells if is_code_solution(c)}
    tests = {grade_id(c) for c in source.cells if is_test(c)}
    variants = assignment.load_variants(name)
    assert sum(not v.is_right for v in variants.values()) >= 3
    assert sum(v.is_right for v in variants.values()) >= 1
    for variant in variants.values():
        assert set(variant.cells) <= solutions, variant.name
        assert variant.loses <= tests, variant.name
        for code in variant.cells.values():
            ast.parse(code)
        for cell_id, code in variant.cells.items():
            instructor = next(c.source for c in source.cells if grade_id(c) == cell_id)
            assert code.strip() != instructor.strip(), f"{variant.name} is the instructor's code"
