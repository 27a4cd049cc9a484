"""The benchmarks, each run once at a tiny size so that they cannot rot.

These are not timed tests: they check the structure and sanity of the rows (fields present,
times and ratios positive and finite, implementations agreeing, grades identical), never speed.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import nbformat
import numpy as np
import pytest

from benchmarks import (
    context,
    engine,
    gloo_collectives,
    goals,
    grading,
    harness,
    pipeline,
    redistribute,
    report,
    sim_collectives,
    startup,
    training,
)

ROW_FIELDS = {"key", "label", "seconds", "baseline", "baseline_seconds", "ratio", "extra"}


def check_rows(rows, keys):
    """``rows`` have exactly ``keys``, every field, and positive finite times and ratios."""
    assert [row["key"] for row in rows] == keys
    for row in rows:
        assert ROW_FIELDS <= set(row), row
        assert isinstance(row["label"], str) and row["label"]
        assert math.isfinite(row["seconds"]) and row["seconds"] > 0, row
        if row["baseline_seconds"] is not None:
            assert row["baseline"], row
            assert math.isfinite(row["ratio"]) and row["ratio"] > 0, row
    harness.check_rows(rows)


# -- harness ---------------------------------------------------------------------------------


def test_fresh_process_gets_the_pinned_environment():
    child = harness.run_fresh("benchmarks.harness:environment_probe")
    assert child["env"] == harness.PINNED_ENV
    assert child["pid"] != os.getpid()


def test_fresh_process_failure_is_reported():
    with pytest.raises(RuntimeError, match="no_such_function"):
        harness.run_fresh("benchmarks.harness:no_such_function")


def test_combine_takes_medians_and_requires_checks_in_every_run():
    runs = [
        [harness.make_row("a", "A", s, 2 * s, "base", agree=ok, n=s)]
        for s, ok in ((1.0, True), (3.0, True), (2.0, False))
    ]
    (row,) = harness.combine(runs)
    assert row["seconds"] == 2.0 and row["baseline_seconds"] == 4.0
    assert row["ratio"] == 0.5  # computed from the medians of each run when not paired
    assert row["extra"] == {"agree": False, "n": 2.0}
    assert row["runs"] == 3 and row["spread"] == 3.0


def test_check_rows_rejects_non_positive_or_missing_times():
    with pytest.raises(ValueError, match="seconds"):
        harness.check_rows([harness.make_row("a", "A", float("nan"))])
    with pytest.raises(ValueError, match="ratio"):
        harness.check_rows([harness.make_row("a", "A", 1.0, 1.0, "b", ratio=-1.0)])


def test_compare_pairs_samples_of_each_candidate():
    samples = harness.compare({"fast": lambda: None, "slow": lambda: sum(range(2000))}, 3, 1e-4)
    assert set(samples) == {"fast", "slow"}
    for s in samples.values():
        assert len(s.wall) == len(s.cpu) == 3 and min(s.wall) > 0 and min(s.cpu) >= 0


# -- the families at tiny sizes --------------------------------------------------------------


@pytest.mark.slow
def test_engine_rows():
    rows = engine.chain_rows("mul", n_ops=5, repeat=2) + engine.chain_rows("matmul", 5, repeat=2)
    rows += engine.mlp_rows(8, repeat=2)
    check_rows(
        rows,
        ["engine.chain.mul", "engine.chain.matmul", "engine.mlp.8.torch", "engine.mlp.8.numpy"],
    )
    assert all(row["extra"]["agree"] is True and row["extra"]["cpu_ratio"] > 0 for row in rows)


def test_engine_agreement_check_catches_a_different_update():
    rng = np.random.default_rng(0)
    params = engine.mlp_init(8, rng)
    x, t = engine.mlp_data(8, rng)
    assert engine._agree([engine.NumpyMLP(params, x, t), engine.EngineMLP(params, x, t)])
    wrong = engine.NumpyMLP(params, x, t)
    wrong.params[0] += 1e-2  # a different model: its loss and update differ
    assert not engine._agree([engine.NumpyMLP(params, x, t), wrong])


def test_sim_rows():
    rows = sim_collectives.bandwidth_rows(size_bytes=1 << 20, repeat=1, calls=1)
    rows += sim_collectives.small_call_rows(repeat=1, calls=20)
    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    check_rows(rows, [f"sim.{op}.1MB" for op in ops] + ["sim.all_reduce.1024B"])
    floors = [row["extra"]["floor_units"] for row in rows[:4]]
    assert floors == [4.0, 2.5, 2.5, 4.0]
    assert rows[-1]["extra"]["cpu_per_call_s"] > 0


def test_sim_inputs_make_the_largest_buffer_the_stated_size():
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        inputs = sim_collectives.rank_inputs(op, 1 << 20, 4)
        largest = inputs[0].nbytes * (4 if op == "all_gather" else 1)
        assert largest == 1 << 20 and len(inputs) == 4


@pytest.mark.slow
def test_gloo_rows():
    rows = gloo_collectives.collect([1024], repeat=1)
    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    check_rows(
        rows,
        [
            "gloo.all_reduce_in_place.1KB",
            "gloo.all_reduce.1KB",
            "gloo.round_trip.1KB",
            "gloo.reduce_from_ranks.1KB",
        ]
        + [f"gloo.busbw.{op}" for op in ops],
    )
    assert all(row["extra"]["agree"] is True for row in rows[:4])
    assert all(row["extra"]["busbw_gb_s"] > 0 for row in rows[4:])
    assert all(row["extra"]["best_ratio"] > 0 for row in rows)
    assert gloo_collectives.bus_factor("all_reduce", 2) == 1.0
    assert gloo_collectives.bus_factor("all_gather", 4) == 0.75


@pytest.mark.slow
def test_pipeline_rows():
    rows = pipeline.collect(sim=(8, 2, 2), gloo=(8, 2, 2), bubble=(16, 4, 1), repeat=1)
    check_rows(
        rows,
        ["pipeline.step_sim.P2", "pipeline.step_sim.P4", "pipeline.step_gloo.P2"]
        + ["pipeline.message_gloo.64B"]
        + [f"pipeline.bubble_gloo.m{m}" for m in pipeline.BUBBLE_MICRO_BATCHES],
    )
    assert all(row["extra"]["agree"] is True and row["baseline"] for row in rows[:3])
    for row, m in zip(rows[4:], pipeline.BUBBLE_MICRO_BATCHES, strict=True):
        assert row["extra"]["bubble_formula"] == 1 / (m + 1)
        assert row["extra"]["bubble_slots"] == pytest.approx(1 / (m + 1), abs=1e-12)
        assert row["extra"]["bubble_measured"] < 1


def test_the_pipeline_benchmarks_one_process_loop_is_the_pipelines_arithmetic():
    model, inputs, targets = pipeline.problem(2, 1, 4, 3, 3)
    from chainrule.parallel import pipeline as pp

    _, reference = pp.one_process_step(model, inputs, targets)
    loop = pipeline.accumulated(model, inputs, targets, np.float64)
    assert pipeline.relative_error(loop, reference) < 1e-14
    wrong = [[g * 2 for g in stage] for stage in loop]
    assert pipeline.relative_error(wrong, reference) == pytest.approx(1.0)


@pytest.mark.slow
def test_redistribute_rows():
    rows = redistribute.collect([1024], repeat=1)
    check_rows(
        rows,
        [
            "redistribute.shard0_to_replicate.1KB",
            "redistribute.partial_to_replicate.1KB",
            "redistribute.partial_to_shard0.1KB",
        ],
    )
    assert all(row["extra"]["agree"] is True and row["baseline"] for row in rows)


@pytest.mark.slow
def test_context_rows():
    rows = context.sim_rows(2, 16, repeat=1) + context.gloo_rows(2, 16, calls=1, repeat=1)
    check_rows(
        rows,
        [
            "context.sim_plain_full",
            "context.sim_zigzag_causal",
            "context.gloo_plain_full",
            "context.gloo_zigzag_causal",
        ],
    )
    assert all(row["extra"]["agree"] for row in rows)


def test_training_rows():
    rows = training.collect(steps=2, repeat=1, width=16)
    rows += training.ddp_rows(width=32, layers=2, cap_bytes=1 << 12, steps=1, repeat=1)
    check_rows(rows, ["training.capstone_sim", "training.capstone_gloo", "training.ddp_buckets"])
    assert all(row["extra"]["agree"] is True and row["baseline"] for row in rows)


def test_the_ddp_benchmark_runs_the_exercises_solution_without_its_markers():
    code = training.solution_code()
    assert "class BucketedDataParallel" in code and "register_post_accumulate_grad_hook" in code
    assert "### BEGIN SOLUTION" not in code and "### END SOLUTION" not in code


@pytest.mark.slow
def test_startup_rows():
    rows = startup.measure(processes=1, repeated=2)
    check_rows(rows, ["startup.first", "startup.first_torch_imported", "startup.repeated"])
    assert all(row["extra"]["correct"] is True for row in rows)


@pytest.mark.slow
@pytest.mark.sandbox
def test_grading_parts_and_batches_run_on_their_smallest_size():
    rows = grading.measure(
        submissions=2, notebooks=["ex1_equal_shards"], assignments=("check_yourself",)
    )
    check_rows(
        rows, ["grading.parts.check_yourself", "grading.sandbox", "grading.batch", "grading.class"]
    )
    parts = rows[0]["extra"]
    assert parts["graded"] is True
    assert 0 < parts["of which imports"] < parts["sandbox start"]
    assert parts["kernel start"] > 0 and parts["nbgrader"] > 0
    assert rows[1]["extra"]["identical_grades"] is True
    extra = rows[2]["extra"]
    assert extra["identical_grades"] is True and extra["all_graded"] is True
    assert extra["distinct_grades"] == 2  # the second student left a cell unanswered
    assert {"machine_two_processes_before", "machine_two_processes_after"} <= extra.keys()
    projected = rows[3]["extra"]
    once, per_student = projected["once_per_batch_s"], projected["per_student_2_workers_s"]
    assert rows[3]["seconds"] == pytest.approx(once + 1000 * per_student)
    assert once + 2 * per_student == pytest.approx(rows[2]["baseline_seconds"])  # 2 submissions
    assert parts["the batch's first student"] > 0


def test_grading_submissions_leave_one_cell_each(tmp_path):
    course = tmp_path / "course"
    for folder in ("source", "release"):
        shutil.copytree(
            grading.REPO / folder / grading.ASSIGNMENT, course / folder / "check_yourself"
        )
    students = grading.write_submissions(course, 3)
    assert students == ["s00", "s01", "s02"]
    unanswered = {}
    for student in students:
        folder = course / "submitted" / student / grading.ASSIGNMENT
        cells = [
            cell
            for path in sorted(folder.glob("*.ipynb"))
            for cell in nbformat.read(path, 4).cells
            if grading._is_solution(cell)
        ]
        assert len(cells) == grading.solution_cells(course)
        assert not any("### BEGIN SOLUTION" in cell.source for cell in cells)
        unanswered[student] = [i for i, c in enumerate(cells) if "NotImplementedError" in c.source]
    assert unanswered == {"s00": [], "s01": [0], "s02": [1]}


def test_grade_differences_name_the_notebook_and_the_missing_students(tmp_path):
    a = {"s00": {"status": "graded", "total": 3.0, "nb1": ("graded", 3.0)}}
    b = {
        "s00": {"status": "graded", "total": 0.0, "nb1": ("graded", 0.0)},
        "s01": {"status": "graded", "total": 1.0, "nb1": ("graded", 1.0)},
    }
    diffs = grading.grade_differences(("seq", tmp_path, a), ("par", tmp_path, b))
    assert len(diffs) == 2
    assert diffs[0].startswith("s00/nb1: seq ('graded', 3.0)") and "('graded', 0.0)" in diffs[0]
    assert "no autograded notebook" in diffs[0] and diffs[1] == "s01: graded by only one batch"
    assert grading.grade_differences(("seq", tmp_path, a), ("seq", tmp_path, a)) == []
    one = grading.grade_differences(("one", tmp_path, a), ("seq", tmp_path, b), same_students=False)
    assert len(one) == 1


# -- goals and report ------------------------------------------------------------------------


def _goal_rows(ratio, agree=True, cpu_ratio=0.5):
    row = harness.make_row(
        "engine.mlp.8.torch", "MLP", 1.0, 1.0, "torch", ratio, agree=agree, cpu_ratio=cpu_ratio
    )
    return [row]


def test_goals_are_judged_on_the_worst_row_and_their_checks():
    goal = goals.GOALS[0]
    assert goals.judge(goal, _goal_rows(0.9)).met is True
    assert goals.judge(goal, _goal_rows(1.2)).met is False
    failed = goals.judge(goal, _goal_rows(0.9, agree=False))
    assert failed.met is False and failed.failed_checks == ("agree",)
    assert goals.judge(goal, []).met is None
    by_cpu = goals.judge(goal, _goal_rows(0.9, cpu_ratio=1.3))  # both clocks must meet it
    assert by_cpu.met is False and by_cpu.field == "cpu_ratio" and by_cpu.value == 1.3
    at_least = goals.Goal("x", "speedup", ("a", "b"), ("ratio",), 1.8, at_most=False)
    rows = [harness.make_row(k, k, 1.0, 1.0, "b", r) for k, r in (("a", 2.0), ("b", 1.5))]
    verdict = goals.judge(at_least, rows)
    assert verdict.met is False and verdict.key == "b"


def test_report_renders_every_section_and_verdict():
    rows = harness.combine([_goal_rows(1.2)])
    verdicts = goals.judge_all(rows)
    machine = harness.describe_machine()
    run_info = {
        "date": "today",
        "command": "python -m benchmarks.run",
        "minutes": 1.0,
        "quick": True,
        "load_start": [9.0, 9.0, 9.0],
        "load_end": [0.1, 0.1, 0.1],
    }
    text = report.render([report.Section("Engine", "About.", rows)], verdicts, machine, run_info)
    assert "## 1. Engine" in text and "| MLP |" in text and "1.20×" in text
    assert "**missed**" in text and "not measured" in text
    assert "shared with other work" in text and "--quick" in text
    assert machine["cpu"] in text
    assert report.fmt_time(12e-6) == "12.0 µs" and report.fmt_time(2.5) == "2.50 s"


def test_report_is_rewritten_from_saved_results(tmp_path):
    from benchmarks import run

    rows = harness.combine([_goal_rows(0.8)])
    batch = harness.make_row(
        "grading.batch", "batch", 4.0, 2.0, "2 workers", identical_grades=True, all_graded=True
    )
    rows += harness.combine([[batch]])
    raw = {
        "run": {
            "date": "today",
            "command": "python -m benchmarks.run",
            "minutes": 1.0,
            "quick": False,
            "code": "abc1234",
            "load_start": [0.1, 0.1, 0.1],
            "load_end": [9.0, 9.0, 9.0],  # the benchmark's own load
        },
        "machine": {"cpu": "a CPU", "usable_cpus": 2, "pinned_env": harness.PINNED_ENV},
        "rows": rows,
    }
    saved, out = tmp_path / "latest.json", tmp_path / "BENCHMARKS.md"
    saved.write_text(json.dumps(raw))
    assert run.main(["--render-from", str(saved), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.index("## 1. Engine") < text.index(
        "## 2. Autograding: where the time goes, and a class's throughput"
    )
    assert "commit abc1234" in text and "shared with other work" not in text
    # the goals are judged again: width 8 met (0.80×), the 2-worker speedup 2.00× met
    assert text.count("**met**") == 2 and "| a CPU |" in text
