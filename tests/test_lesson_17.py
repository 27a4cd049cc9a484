"""Lesson 17 (context parallelism) runs headless from a fresh kernel and computes what it states:
every number it shows is checked here, against the rules the lesson derives."""

from __future__ import annotations

import re

import nbformat
import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

SMALLEST_TEXT = (
    "__import__('chainrule.course.widgets.live_widget', fromlist=['_']).smallest_text_px({})"
)

# What the exercise on ring attention's backward asks students to write: not on this page.
EXERCISE_ONLY = r"autograd\.Function|duality_torch|def \w*backward|context_torch"


def test_lesson_17_context_parallelism():
    fetch = [
        "(WIDTH, HEADS, BYTES, CP, GiB)",
        "memory",
        "(largest_score, merge_errors)",
        "(H, N, D, P)",
        "errors",
        "(ring_counts, hops)",
        "deadlock",
        "(plain_work, zigzag_work)",
        "idle",
        "(ring_widget.values(), ring_widget.last_result.work, ring_widget.last_result.idle)",
        SMALLEST_TEXT.format("ring_widget.render_figure(ring_widget.last_result)"),
        "(moves, shapes)",
        "(traced_bytes, by_formula)",
        "(longest, inside_attention)",
    ]
    nb, v = run_lesson(lesson(17), fetch)
    width, heads, nbytes, cp_ranks, gib = v[fetch[0]]
    assert (width, heads, nbytes, cp_ranks, gib) == (4096, 32, 2, 8, 2**30)

    # what a long sequence costs: 4nh numbers, a·n² scores, split by P
    for n, m in v["memory"].items():
        n = int(n)
        assert m["qkvo"] == 4 * n * width * nbytes / gib
        assert m["scores"] == heads * n * n * nbytes / gib
        assert m["qkvo per rank"] == m["qkvo"] / cp_ranks
        assert m["block of scores"] == m["scores"] / cp_ranks**2
    assert v["memory"]["131072"]["scores"] == 1024 and v["memory"]["4096"]["qkvo"] == 0.125

    # the merge of two partial softmaxes, at scores where a plain exp overflows float32
    largest, merge_errors = v[fetch[2]]
    assert largest > 88
    assert sorted(merge_errors) == ["1", "11", "5"]
    assert all(0 <= e < 1e-13 for e in merge_errors.values())

    # every variant equals one process, forward and backward
    H, N, D, P = v[fetch[3]]
    assert (H, N, D, P) == (4, 24, 3, 4)
    errors = v["errors"]
    assert len(errors) == 5 and {k.split(",")[0] for k in errors} == {"ring", "ulysses"}
    for name, errs in errors.items():
        assert len(errs) == 4 and max(errs) < 1e-13, name

    # what travels: P − 1 blocks of K and V per rank forward, the same back the other way
    counts, hops = v[fetch[5]]
    block = 2 * H * (N // P) * D * 8
    assert counts == {"forward": [P * (P - 1), P * (P - 1) * block]} | {
        "backward": [P * (P - 1), P * (P - 1) * block]
    }
    assert hops["forward"] == [[r, (r + 1) % P] for r in range(P)]
    assert sorted(hops["backward"]) == sorted([[(r + 1) % P, r] for r in range(P)])
    assert v["deadlock"].startswith("deadlock: rank 0 waits in send #0 to rank 1")

    # causal work per rank and step
    plain, zigzag = v[fetch[7]]
    assert [sum(row) for row in plain] == [r + 0.5 for r in range(P)]
    assert [sum(row) for row in zigzag] == [P / 2] * P
    assert all(x == 0.5 for row in zigzag for x in row)
    assert plain[0] == [0.5] + [0] * (P - 1)  # rank 0 works at step 0 only
    for world, (counted, formula, zz) in v["idle"].items():
        world = int(world)
        assert counted == pytest.approx(formula, abs=1e-15)
        assert formula == (world - 1) / (2 * world - 1) and zz == 0.0
    assert sorted(int(w) for w in v["idle"]) == [2, 4, 8, 16, 64]

    # the widget at its first setting, readable
    values, work, idle = v[fetch[9]]
    assert values == {"world_size": 4, "layout": "plain", "causal": True}
    assert work == plain and idle == pytest.approx(3 / 7, abs=1e-15)
    assert v[fetch[10]] >= 9

    # Ulysses: heads ↔ sequence, four all-to-alls forward, four transposed backward
    moves, shapes = v[fetch[11]]
    assert shapes == [[H, N // P, D], [H, N // P, D]]
    forward = [m for m in moves if m[0] == "forward"]
    backward = [m for m in moves if m[0] == "backward"]
    assert [(s, c, shape) for _, s, c, shape in forward] == [(0, 1, [H, N // P, D])] * 3 + [
        (1, 0, [H // P, N, D])
    ]
    assert len(backward) == 4
    assert sorted((s, c) for _, s, c, _ in backward) == [(0, 1)] + [(1, 0)] * 3
    traced, by_formula = v[fetch[12]]
    local = H * (N // P) * D * 8
    assert traced == {"ring": (P - 1) * 2 * local, "Ulysses": 4 * (P - 1) / P * local}
    for world, (ring, ulysses) in by_formula.items():
        world = int(world)
        assert ring == (world - 1) * 2 * local and ulysses == 4 * (world - 1) * local // world
        assert ring / ulysses == world / 2

    # inside attention: the whole sequence (lesson 11) against n/P
    longest, inside = v[fetch[13]]
    assert list(inside.values()) == [longest, longest // cp_ranks] and longest == 131072

    # the mechanism on the page, and nothing of the exercise
    markdown = "\n".join(output_texts(nb, "text/markdown"))
    for name in (
        "def block_attention",
        "def merge_partials",
        "def ring_pass",
        "def ring_attention",
        "def ulysses_attention",
    ):
        assert name in markdown, name
    assert f"Largest score: {largest:.1f}." in markdown
    assert f"ring {traced['ring']:g}, Ulysses {traced['Ulysses']:g}." in markdown
    stored = nbformat.read(lesson(17), as_version=4)
    for cell in stored.cells:
        assert not re.search(EXERCISE_ONLY, cell.source), cell.id
    assert not re.search(EXERCISE_ONLY, markdown)
    last = stored.cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## Check yourself")
    assert len(output_texts(nb, "image/png")) == 0  # the widget draws its own
