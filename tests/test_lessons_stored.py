"""Every lesson notebook is stored the same way: valid, without outputs, with cell ids and the
python3 kernel; every lesson ends by pointing to its exercise; no derived number is typed into
the prose (the lessons compute them)."""

from __future__ import annotations

import re

import nbformat
import pytest
from notebook_runner import REPO, markdown_text

COURSE = REPO / "course"
NOTEBOOKS = sorted(COURSE.glob("*.ipynb"))
LESSONS = [path for path in NOTEBOOKS if not path.name.startswith("00_")]
EXERCISES = sorted(p.name for p in (REPO / "release" / "check_yourself").glob("ex*.ipynb"))

# Numbers the syllabus derives (its worked example, the 900/300 weights, float16's largest
# value, the crossover of lesson 1): the lessons show them as outputs of code, never in prose.
DERIVED = ["4.25", "7.0", "1.5", "5.5", "1/1800", "1/600", "1/1200", "65504", "2/3"]


def test_the_course_has_a_start_page_and_seven_lessons():
    assert [p.name[:2] for p in NOTEBOOKS] == ["00", "01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs_with_ids_and_kernelspec(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    ids = [cell.get("id") for cell in nb.cells]
    assert all(ids) and len(set(ids)) == len(ids)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_ends_with_a_check_yourself_pointer_to_an_exercise(path):
    last = nbformat.read(path, as_version=4).cells[-1]
    assert last.cell_type == "markdown" and "Check yourself" in last.source
    targets = re.findall(r"\(\.\./release/check_yourself/([^)]+)\)", last.source)
    assert targets and set(targets) <= set(EXERCISES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_derived_number_is_typed_into_the_prose(path):
    # Headings are left out: "## 1.5 ..." is a section number.
    text = "\n".join(x for x in markdown_text(path).splitlines() if not x.startswith("#"))
    typed = [n for n in DERIVED if re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", text)]
    assert typed == [], f"{path.name} types {typed} into its prose"
