"""Every lesson in the browser: it opens without unsaved changes, Run All finishes with every
code cell executed and no error output, and every live widget, each control moved to both of
its ends (every slider to its minimum and maximum, every dropdown to its first and last
option), recomputes for exactly the new values with no error, and keeps its picture on the page.

Screenshots of each lesson after Run All and of each widget at each end of each control go to
``test-artifacts/browser/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from lab_page import LabPage
from lab_server import LabServer
from playwright.sync_api import Locator

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LESSONS = sorted(p.name for p in (Path(__file__).parents[2] / "course").glob("[0-9][0-9]_*.ipynb"))


def saved_errors(notebook: nbformat.NotebookNode) -> list[str]:
    """Error outputs in a saved notebook, as 'cell N: Name: message'."""
    return [
        f"cell {index}: {output.get('ename')}: {output.get('evalue')}"
        for index, cell in enumerate(notebook.cells)
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]


def unexecuted_cells(notebook: nbformat.NotebookNode) -> list[int]:
    """Indices of non-empty code cells of a saved notebook that have no execution count."""
    return [
        index
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code" and cell.source.strip() and cell.execution_count is None
    ]


def assert_picture_shown(widget: Locator, where: str) -> None:
    image = widget.locator("img")
    if image.count():
        assert image.first.is_visible(), f"{where}: the widget's picture is hidden"
        width = image.first.evaluate("img => img.naturalWidth")
        assert width > 0, f"{where}: the widget's picture is empty"


def move_to_ends(lab: LabPage, widget: Locator, lesson: str, index: int) -> int:
    """Every slider to both ends, every dropdown to its first and last option; after each move
    the widget shows the new values, no error, and its picture. Returns the number of moves."""
    moves = 0
    names = list(re.findall(r'"([^"]+)":', lab.widget_state(widget)))
    controls = widget.locator(".widget-slider, .widget-dropdown, .widget-text").all()
    assert len(controls) == len(names), f"{lesson}: controls {len(controls)} vs state {names}"
    for name, control in zip(names, controls, strict=True):
        kind = control.get_attribute("class") or ""
        if "widget-slider" in kind:
            handle = control.locator(".noUi-handle[role=slider]").first
            ends = [
                ("Home", handle.get_attribute("aria-valuemin")),
                ("End", handle.get_attribute("aria-valuemax")),
            ]
            for key, end in ends:
                if float(handle.get_attribute("aria-valuenow")) == float(end):
                    continue
                before = lab.widget_state(widget)
                handle.scroll_into_view_if_needed()
                handle.focus()
                handle.press(key)
                state = lab.wait_for_widget_state(widget, before, lesson)
                assert handle.get_attribute("aria-valuenow") == end, (lesson, name)
                shown = float(control.locator(".widget-readout").inner_text().replace("−", "-"))
                assert state["values"][name] == pytest.approx(shown, abs=0.006), (name, state)
                assert state["error"] == "", f"{lesson} {name} at {end}: {state['error']}"
                assert_picture_shown(widget, f"{lesson} {name} = {end}")
                widget.scroll_into_view_if_needed()
                lab.record(f"widget{index}_{name}_{key.lower()}")
                moves += 1
        elif "widget-dropdown" in kind:
            select = control.locator("select")
            options = select.locator("option").all_inner_texts()
            for label in (options[0], options[-1]):
                if select.evaluate("s => s.options[s.selectedIndex].text") == label:
                    continue
                before = lab.widget_state(widget)
                select.select_option(label=label)
                state = lab.wait_for_widget_state(widget, before, lesson)
                assert state["error"] == "", f"{lesson} {name} = {label}: {state['error']}"
                assert_picture_shown(widget, f"{lesson} {name} = {label}")
                widget.scroll_into_view_if_needed()
                lab.record(f"widget{index}_{name}_{options.index(label)}")
                moves += 1
    return moves


@pytest.fixture
def lab(kept_lab: LabPage) -> LabPage:
    """The lessons' tests share one JupyterLab page, as a student opens one lesson after
    another in the JupyterLab they keep open."""
    return kept_lab


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs_clean_and_its_widgets_work_at_every_end(
    lab: LabPage, lab_server: LabServer, lesson: str
) -> None:
    path = f"course/{lesson}"
    lab.open_notebook(path)
    assert not lab.has_unsaved_changes(lesson), "the lesson shows unsaved changes on opening"

    prompts = lab.run_all(lesson)
    assert lab.error_outputs() == [], "Run All rendered error outputs"
    not_run = [prompt for prompt in prompts if not re.fullmatch(r"\[\d+\]:", prompt)]
    assert prompts and not not_run, f"cells that did not run: {not_run} of {prompts}"
    lab.record("ran_all")

    for index, widget in enumerate(lab.live_widgets()):
        widget.scroll_into_view_if_needed()
        lab.record(f"widget{index}")
        move_to_ends(lab, widget, lesson, index)
    assert lab.error_outputs() == [], "moving the widgets rendered an error"

    lab.save(lesson)
    saved = nbformat.read(lab_server.root / path, as_version=4)
    assert saved_errors(saved) == []
    assert unexecuted_cells(saved) == []


def test_the_averaging_widget_hides_its_picture_when_the_shard_sizes_do_not_fit(
    lab: LabPage,
) -> None:
    lesson = "03_averaging_is_exact.ipynb"
    lab.open_notebook(f"course/{lesson}")
    lab.run_all(lesson)
    (widget,) = lab.live_widgets()
    widget.scroll_into_view_if_needed()
    sizes = widget.locator(".widget-text input").nth(1)
    before = lab.widget_state(widget)
    sizes.fill("1, 1, 1")
    sizes.press("Enter")
    state = lab.wait_for_widget_state(widget, before, lesson)
    assert "give 2 shard sizes" in state["error"]
    assert "Not possible" in widget.inner_text()
    assert not widget.locator("img").first.is_visible(), "a stale picture under the message"
    lab.record("invalid_sizes")
    before = lab.widget_state(widget)
    sizes.fill("3, 1")
    sizes.press("Enter")
    state = lab.wait_for_widget_state(widget, before, lesson)
    assert state["error"] == "" and state["values"]["shard_sizes"] == "3, 1"
    assert_picture_shown(widget, "shard sizes 3, 1")


def test_the_sharded_matmul_widget_shows_the_blocks_no_rank_computes_and_the_remedy(
    lab: LabPage,
) -> None:
    lesson = "09_placements_and_the_sharded_matmul.ipynb"
    lab.open_notebook(f"course/{lesson}")
    lab.run_all(lesson)
    (widget,) = lab.live_widgets()
    widget.scroll_into_view_if_needed()
    choices = widget.locator(".widget-dropdown select")
    for index, label in ((0, "Shard(0)"), (1, "Shard(1)")):  # A by rows, B by columns: case 4
        before = lab.widget_state(widget)
        if json.loads(before)["ab"[index]] == label:
            continue  # already so: nothing to recompute
        choices.nth(index).select_option(label=label)
        state = lab.wait_for_widget_state(widget, before, lesson)
        assert state["error"] == ""
    text = widget.inner_text()
    assert "invalid" in text and "Remedy:" in text and "all-gather" in text
    assert_picture_shown(widget, "the invalid case")
    lab.record("invalid_case")
    before = lab.widget_state(widget)
    choices.nth(0).select_option(label="Shard(1)")  # A by columns, B by columns: gather A first
    lab.wait_for_widget_state(widget, before, lesson)
    assert "all-gather first" in widget.inner_text()
    assert "reduce-scatter" in widget.inner_text()  # the gathered A fans out: its backward
    assert_picture_shown(widget, "the all-gather-first case")
    # A replicated, B by rows: case 2's two remedies side by side, and the rows decide.
    for index, label in ((0, "Replicate()"), (1, "Shard(0)")):
        before = lab.widget_state(widget)
        choices.nth(index).select_option(label=label)
        assert lab.wait_for_widget_state(widget, before, lesson)["error"] == ""
    assert "Case 2 has two remedies" in widget.inner_text()
    rows = widget.locator(".widget-slider").nth(1).locator(".noUi-handle[role=slider]").first
    for key, fewer in (("Home", "reduce C"), ("End", "gather B")):  # 64 rows, then 16384
        before = lab.widget_state(widget)
        rows.scroll_into_view_if_needed()
        rows.focus()
        rows.press(key)
        state = lab.wait_for_widget_state(widget, before, lesson)
        assert state["error"] == "" and state["values"]["log2_rows"] == (6 if key == "Home" else 14)
        assert f"Fewer bytes per step: {fewer}" in widget.inner_text(), key
        assert_picture_shown(widget, f"case 2 with log2 rows at its {key}")
        widget.scroll_into_view_if_needed()
        lab.record(f"case_two_rows_{key.lower()}")
