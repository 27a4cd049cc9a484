"""Every lesson notebook (and every exercise, in source/ and release/) is stored the same way:
valid, without outputs, with cell ids and the python3 kernel's full language information (so
that JupyterLab has nothing to add when it opens one); the lessons are numbered 00, 01, ...
without gaps, listed and linked in order; every lesson ends by pointing to its exercise; no
derived number is typed into the prose (the lessons compute them); and no lesson gives away an
exercise's answer."""

from __future__ import annotations

import re

import nbformat
import pytest
from assignment_fixtures import ASSIGNMENTS as ASSIGNMENT_FOLDERS
from notebook_runner import COURSE, REPO, lesson_notebooks, markdown_text

NOTEBOOKS = lesson_notebooks()
LESSONS = NOTEBOOKS[1:]
ASSIGNMENTS = tuple(a.name for a in ASSIGNMENT_FOLDERS)
EXERCISES = sorted(
    f"{assignment}/{p.name}"
    for assignment in ASSIGNMENTS
    for p in (REPO / "release" / assignment).glob("ex*.ipynb")
)
EXERCISE_LINK = rf"\(\.\./release/((?:{'|'.join(ASSIGNMENTS)})/[^)]+)\)"

# Numbers the syllabus derives (its worked example, the 900/300 weights, float16's largest
# value, the crossover of lesson 1): the lessons show them as outputs of code, never in prose.
DERIVED = ["4.25", "7.0", "1.5", "5.5", "1/1800", "1/600", "1/1200", "65504", "2/3"]

# What would hand an exercise's answer over (the exercises ask for these; see each pattern's
# note). Checked in every cell, code and prose, of every lesson.
ANSWERS = {
    "ex1: the exact reduction for unequal shards": r"weighted[ _-]?mean|\|B_p\|\s*/\s*\|B\||"
    r"\\frac\{\|\\mathcal B_p\|\}\{\|\\mathcal B\|\}|token_weighted",
    "ex1: which step uses equal sizes": r"(only|one) step .{0,40}(equal|size)|"
    r"the one place equal sizes|equal-size assumption",
    "ex2: the per-token weights and the fix": r"1/\(P\s*T_p\)|\\frac\{1\}\{P\s*T_p\}|"
    r"token_weighting|weighted_by_hand",
    "ex3: a reusable split-invariance check": r"norm_split_gaps|sharded_norm_gradient|"
    r"split_invarian",
    "ex4: the all-gather row's code or derivation": r"gather_from_ranks|gather_replicated|"
    r"all_gather_replicated|S_q\\Big\(\\sum_p \\bar y_p",
    "ex5: torch autograd Functions of f and f̄": r"autograd\.Function|duality_torch",
    "ex5: the pair right to the second order (each backward the other Function)": r"Copy\.apply"
    r"\(grad|Reduce\.apply\(grad|create_graph",
    "sharded ex1: the placement of B and the bytes of its passes": r"B_PLACEMENT|bytes_per_rank|"
    r"vocabulary[- ]parallel",
    "sharded ex2: the sum over ranks of the shared key and value": r"multi-query|shared key|"
    r"copy_to_ranks\(x @ w[kv]",
    "sharded ex3: the collectives written by hand, the biases' gradients": r"gather_sequence|"
    r"scatter_sequence|sp_region|bias(es)? .{0,60}(sequence|tokens).{0,60}all-reduc",
    "training ex1: the bucketed, hooked all-reduce of gradients": r"BucketedDataParallel|"
    r"register_post_accumulate_grad_hook|finish_gradient_synchronization",
    "training ex2: Adam's moments sharded by hand (ZeRO-1)": r"ZeroAdam|exp_avg_sq|torch\.optim",
    "training ex3: the all-to-all with uneven split sizes and its transpose, a token's rows added "
    "up": r"output_split_sizes|input_split_sizes|index_add|scatter_add",
    "pipeline ex1: a boundary of two tensors as autograd Functions, the 1F1B step on them": r"mark_"
    r"non_differentiable|Recv\.apply\(|Send\.apply\(|pipeline_step\(W",
    "pipeline ex2: ring attention's hand-written backward, the gradients riding the ring": r"Ring"
    r"Attention\.apply|grad_k, grad_v = ring_pass|rowsum\(dO",
    "pipeline ex3: the cost model of a layout, and the choice of one": r"memory_per_device|"
    r"best_layout|step_time\(model",
}


def test_lessons_are_numbered_from_00_without_gaps():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(len(NOTEBOOKS))) and len(NOTEBOOKS) >= 9
    assert NOTEBOOKS[0].name == "00_start.ipynb"


def test_the_start_page_lists_every_lesson_in_order_and_every_exercise():
    text = markdown_text(NOTEBOOKS[0])
    rows = re.findall(r"^\| (\d+) \| \[[^\]]+\]\((\d\d_[a-z0-9_]+\.ipynb)\)", text, re.M)
    assert [(int(n), name) for n, name in rows] == [(int(p.name[:2]), p.name) for p in LESSONS]
    exercise_links = re.findall(EXERCISE_LINK, text)
    assert EXERCISES and sorted(exercise_links) == EXERCISES
    assert "Validate" in text and "Assignment List" in text and "Submit" in text


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_lesson_has_its_number_and_links_to_the_next(path):
    number = int(path.name[:2])
    text = markdown_text(path)
    assert re.match(rf"# {number} ·|# {number}\. ", text), f"{path.name} has no '# {number}' title"
    for target in re.findall(r"\]\((\d\d_[a-z0-9_]+\.ipynb)\)", text):
        assert (COURSE / target).is_file(), f"{path.name} links to a missing {target}"
    if number < len(LESSONS):
        following = NOTEBOOKS[number + 1].name
        assert re.search(rf"Next: \[{number + 1}\. [^\]]+\]\({following}\)", text), path.name


EXERCISE_NOTEBOOKS = sorted(
    p for folder in ("source", "release") for p in (REPO / folder).glob("*/ex*.ipynb")
)


@pytest.mark.parametrize(
    "path", NOTEBOOKS + EXERCISE_NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO).with_suffix(""))
)
def test_stored_without_outputs_with_ids_and_the_kernels_language_info(path):
    from ipykernel.ipkernel import IPythonKernel

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    expected = {k: v for k, v in IPythonKernel.language_info.items() if k != "version"}
    stored = dict(nb.metadata.language_info)
    assert re.fullmatch(r"\d+\.\d+\.\d+", stored.pop("version"))
    assert stored == expected  # JupyterLab writes these on opening; stored, it has nothing to do
    ids = [cell.get("id") for cell in nb.cells]
    assert all(ids) and len(set(ids)) == len(ids)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_ends_with_a_check_yourself_pointer_to_an_exercise(path):
    last = nbformat.read(path, as_version=4).cells[-1]
    assert last.cell_type == "markdown" and "Check yourself" in last.source
    targets = re.findall(EXERCISE_LINK, last.source)
    assert targets and set(targets) <= set(EXERCISES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_derived_number_is_typed_into_the_prose(path):
    # Headings are left out: "## 1.5 ..." is a section number.
    text = "\n".join(x for x in markdown_text(path).splitlines() if not x.startswith("#"))
    typed = [n for n in DERIVED if re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", text)]
    assert typed == [], f"{path.name} types {typed} into its prose"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_lesson_gives_an_exercise_answer_away(path):
    nb = nbformat.read(path, as_version=4)
    found = {
        what: [i for i, cell in enumerate(nb.cells) if re.search(pattern, cell.source, re.I)]
        for what, pattern in ANSWERS.items()
    }
    assert {what: cells for what, cells in found.items() if cells} == {}, path.name
