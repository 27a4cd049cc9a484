"""Lesson 14 (expert parallelism) runs headless from a fresh kernel and computes what it states:
every number it shows is checked here, against the rules the lesson derives."""

from __future__ import annotations

import math
import re

import nbformat
import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

SMALLEST_TEXT = (
    "__import__('chainrule.course.widgets.live_widget', fromlist=['_']).smallest_text_px({})"
)

# What the exercise on the backward of expert dispatch asks students to write: not on this page.
EXERCISE_ONLY = r"autograd\.Function|input_split_sizes|output_split_sizes|duality_torch"


def _report(expression: str) -> str:
    return (
        f"(lambda r: {{'C': r.capacity, 'E': r.num_experts, 'P': r.world_size, "
        f"'T': r.tokens_per_rank, 'load': r.load.tolist(), 'kept': r.kept.tolist(), "
        f"'dropped': r.dropped.tolist(), 'padding': r.padding.tolist(), "
        f"'bytes': r.bytes_per_all_to_all, 'padding_bytes': r.padding_bytes.tolist()}})"
        f"({expression})"
    )


def _check_report(r, capacity_factor, d):
    """The report's numbers follow from its loads and the capacity, as the lesson says."""
    P, E, T, C = r["P"], r["E"], r["T"], r["C"]
    assert C == math.ceil(capacity_factor * T / E)
    share = E // P
    for p in range(P):
        assert sum(r["load"][p]) == T
        assert r["kept"][p] == [min(n, C) for n in r["load"][p]]
        assert r["dropped"][p] == T - sum(r["kept"][p])
        assert r["padding"][p] == E * C - sum(r["kept"][p])
        away = [e for e in range(E) if e // share != p]
        assert r["padding_bytes"][p] == sum(C - r["kept"][p][e] for e in away) * d * 8
    assert r["bytes"] == (P - 1) / P * E * C * d * 8


def test_lesson_14_expert_parallelism():
    fetch = [
        "(D, HIDDEN, TOKENS, EXPERTS, CAPACITY_FACTOR, P)",
        "(small_routing.capacity, small_routing.dropped, small_routing.padding, "
        "small_routing.expert.tolist(), small_routing.slot.tolist(), small_routing.kept.tolist())",
        "{P: tuple(a) for P, a in adjoint.items()}",
        "{str(k): v for k, v in runs.items()}",
        "gloo_vs_sim",
        "[(e.op, e.kwargs.get('split_axis'), e.kwargs.get('concat_axis'), list(e.shapes[0]), "
        "event_bytes(e)) for e in step_trace]",
        _report("step_report"),
        "capacity_sweep",
        "{c: " + _report("ex.dispatch_report(ex.routings_of(weights, x, c), D)") + " for c in "
        "capacity_sweep}",
        "drop_checks",
        "(as_one_group[0].capacity, routings[0].capacity, same_slots)",
        _report("routing_widget.last_result.report"),
        "(routing_widget.last_result.capacity_factor, routing_widget.values())",
        SMALLEST_TEXT.format("load_picture"),
        SMALLEST_TEXT.format("plot_routing(routing_widget.last_result)"),
        "(buffer_bytes, switch_bytes, ring_bytes)",
    ]
    nb, v = run_lesson(lesson(14), fetch)
    d, _, T, E, c, P = v[fetch[0]]
    assert (d, T, E, P) == (8, 24, 12, 4)

    # the small routing table: slots in token order, capacity ⌈T/E⌉
    capacity, dropped, padding, expert, slot, kept = v[fetch[1]]
    assert capacity == math.ceil(1.0 * len(expert) / 4)
    assert slot == [expert[:t].count(expert[t]) for t in range(len(expert))]
    assert kept == [s < capacity for s in slot]
    assert dropped == kept.count(False) > 0 and padding == 4 * capacity - kept.count(True) > 0

    # the adjoint identity of the dispatch, summed over ranks
    adjoint = v[fetch[2]]
    assert sorted(adjoint) == ["2", "3", "4"]
    for forward, backward in adjoint.values():
        assert forward == pytest.approx(backward, rel=1e-12) and abs(forward) > 1e-3

    # the layer on the ranks equals one process, with uneven loads and drops
    runs = v[fetch[3]]
    assert {k for k in runs if "sim" in k} == {f"('sim', {n})" for n in (1, 2, 3, 4)}
    for key, r in runs.items():
        n = int(key.rstrip(")").split(", ")[-1])
        assert r["error"] < 1e-12, key
        assert r["experts per rank"] == E // n and r["C"] == math.ceil(c * T / E)
        assert 0 < r["dropped"] < n * T
        assert r["padding"] == n * E * r["C"] - (n * T - r["dropped"])  # slots not taken
        assert r["largest load"] > n * T / E  # uneven: above the mean
        twin = runs.get(key.replace("gloo", "sim"))
        assert twin == r or twin["error"] == pytest.approx(r["error"], abs=1e-12)
    for P_, error in v["gloo_vs_sim"].items():
        assert error < 1e-12, P_

    # one step's collectives: dispatch and combine, their transposes, the router's all-reduces
    events = v[fetch[5]]
    report = v[fetch[6]]
    _check_report(report, c, d)
    moves = [(s, k) for op, s, k, _, _ in events if op == "all_to_all"]
    assert moves == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert [op for op, *_ in events].count("all_reduce") == 2
    for op, _, _, shape, sent in events:
        if op == "all_to_all":
            assert sent == report["bytes"]
        else:
            assert sent == 2 * (P - 1) / P * math.prod(shape) * 8
    assert [shape for op, _, _, shape, _ in events if op == "all_to_all"][:2] == [
        [E, report["C"], d],
        [E // P, P * report["C"], d],
    ]

    # the bytes assume every pair of ranks connected; a one-way ring forwards chunks
    buffer_bytes, switch_bytes, ring_bytes = v[fetch[15]]
    assert buffer_bytes == E * report["C"] * d * 8 and switch_bytes == report["bytes"]
    assert ring_bytes == (P - 1) / 2 * buffer_bytes and ring_bytes / switch_bytes == P / 2

    # the capacity sweep
    sweep, reports = v["capacity_sweep"], v[fetch[8]]
    assert list(sweep) == ["0.5", "1.0", "1.25", "2.0", "12.0"]
    drops = [s["dropped"] for s in sweep.values()]
    assert drops == sorted(drops, reverse=True) and drops[0] > 0 and drops[-1] == 0
    for key, s in sweep.items():
        r = reports[key]
        _check_report(r, float(key), d)
        assert s["C"] == r["C"] and s["slots"] == P * E * r["C"]
        assert s["dropped"] == sum(r["dropped"]) and s["padding"] == sum(r["padding"])
        assert s["padding"] == s["slots"] - (P * T - s["dropped"])
        assert s["bytes"] == r["bytes"]
        assert s["padding share"] == pytest.approx(sum(r["padding_bytes"]) / (P * r["bytes"]))
    assert sweep["12.0"]["C"] == T  # never dropping needs room for every token

    # dropped tokens: no gradient to the router or the experts, the residual's to the tokens
    checks = v["drop_checks"]
    zeros = [k for k in checks if not k.startswith(("tokens kept", "relative"))]
    assert len(zeros) == 3 and all(checks[k] == 0.0 for k in zeros)
    one_group_capacity, rank_capacity, same_slots = v[fetch[10]]
    assert one_group_capacity == P * rank_capacity  # the same slots in total...
    assert same_slots == rank_capacity * E / T
    assert checks["tokens kept differently as one group (the same slots in total)"] > 0
    assert checks["relative change of the router's gradient with room for every token"] > 0.01

    # the widget at its first setting, and the pictures readable
    widget_report = v[fetch[11]]
    factor, values = v[fetch[12]]
    assert values == {
        "capacity_factor": 1.0,
        "world_size": 2,
        "experts_per_rank": 2,
        "skew": 1.0,
        "tokens_per_rank": 16,
    }
    _check_report(widget_report, factor, 8)
    assert v[fetch[13]] >= 9 and v[fetch[14]] >= 9
    assert len(output_texts(nb, "image/png")) == 1  # the loads; the widget draws its own

    # the mechanism on the page, and nothing of the exercise
    markdown = "\n".join(output_texts(nb, "text/markdown"))
    assert not re.search(r"(?<![\d.])1 (experts|slots|tokens|ranks|padding slots)\b", markdown)
    noun = lambda n, word: f"{n} {word}" + ("" if n == 1 else "s")  # noqa: E731
    assert (
        f"Capacity $C$ = {noun(capacity, 'slot')} per expert; {noun(dropped, 'token')} dropped, "
        f"{noun(padding, 'padding slot')}."
    ) in markdown
    for name in (
        "def all_to_all_ranks",
        "def dispatch",
        "def combine",
        "def route",
        "def expert_parallel_moe",
        "def one_process_moe",
    ):
        assert name in markdown, name
    stored = nbformat.read(lesson(14), as_version=4)
    for cell in stored.cells:
        assert not re.search(EXERCISE_ONLY, cell.source), cell.id
    assert not re.search(EXERCISE_ONLY, markdown)
    last = stored.cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## Check yourself")
    assert "(../release/training/ex3_expert_dispatch_backward.ipynb)" in last.source
    assert re.search(
        r"Next: \[15\. [^\]]+\]\(15_capstone_a_transformer_on_four_ranks\.ipynb\)",
        stored.cells[-2].source,
    )
