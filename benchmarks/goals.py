"""The targets the results are judged against, and the judging.

A goal names the rows it covers, the fields it reads (``ratio``, ``seconds`` or extra fields)
and a limit; the worst value over those rows and fields decides. The engine's goals read both
the wall-clock ratio and the CPU-time ratio: on a loaded machine the wall clock also counts
waiting for a core, and a goal is met only if it holds either way. A goal also lists sanity
fields that must be true (the implementations agreed, the grades were identical): a fast wrong
answer misses.
A goal whose rows were not measured (a ``--quick`` run measures smaller sizes) is "not measured".

Goals on absolute times that the machine, not the code, decides are read as ratios to a
baseline timed alongside: the first gloo run's 1.5 s assumed the anchor's 1 s for a fresh
``import torch`` (which takes 2–2.6 s on some machines of this kind), so it is read as 1.5×
that import, timed in the same run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import Row


@dataclass(frozen=True)
class Goal:
    """Each of ``fields`` of every row in ``keys`` is at most (or at least) ``limit``."""

    family: str
    text: str
    keys: tuple[str, ...]
    fields: tuple[str, ...]
    limit: float
    at_most: bool = True
    checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """How one goal came out: the deciding value, its row and field, whether the goal is met."""

    goal: Goal
    value: float | None
    key: str | None
    field: str | None
    met: bool | None  # None: not measured
    failed_checks: tuple[str, ...] = ()

    @property
    def unit(self) -> str:
        """ "seconds" when the deciding value is a time, else "ratio"."""
        return "seconds" if self.field is not None and self.field.endswith("seconds") else "ratio"


def _gloo_keys(kind: str, sizes: Sequence[str]) -> tuple[str, ...]:
    return tuple(f"gloo.{kind}.{size}" for size in sizes)


ENGINE_RATIOS = ("ratio", "cpu_ratio")

GOALS: tuple[Goal, ...] = (
    Goal(
        "engine",
        "MLP step ≤ 1.0× PyTorch, width 8",
        ("engine.mlp.8.torch",),
        ENGINE_RATIOS,
        1.0,
        checks=("agree",),
    ),
    Goal(
        "engine",
        "MLP step ≤ 1.0× PyTorch, width 64",
        ("engine.mlp.64.torch",),
        ENGINE_RATIOS,
        1.0,
        checks=("agree",),
    ),
    Goal(
        "engine",
        "MLP step ≤ 1.1× hand-written numpy, width 512",
        ("engine.mlp.512.numpy",),
        ENGINE_RATIOS,
        1.1,
        checks=("agree",),
    ),
    Goal(
        "sim",
        "all_reduce of 64 MB, P=4 ≤ 6 memcpy units",
        ("sim.all_reduce.64MB",),
        ("ratio",),
        6.0,
    ),
    Goal(
        "sim",
        "all_reduce of 1 KB, P=4 ≤ 30 µs per call",
        ("sim.all_reduce.1024B",),
        ("seconds",),
        30e-6,
    ),
    Goal(
        "gloo",
        "wrapper all_reduce in place ≤ 1.10× raw, from 64 KB",
        _gloo_keys("all_reduce_in_place", ("64KB", "1MB", "16MB", "64MB")),
        ("ratio",),
        1.10,
        checks=("agree",),
    ),
    Goal(  # one copy is what a new result costs; the same 10% as in place for the rest
        "gloo",
        "functional wrapper all_reduce ≤ raw + one copy of the result (within 10%), from 64 KB",
        _gloo_keys("all_reduce", ("64KB", "1MB", "16MB", "64MB")),
        ("ratio",),
        1.10,
        checks=("agree",),
    ),
    Goal(
        "gloo",
        "differentiable all-reduce f̄(f(x)) fwd+bwd ≤ 2.3× one raw all_reduce",
        _gloo_keys("round_trip", ("1KB", "64KB", "1MB", "16MB", "64MB")),
        ("ratio",),
        2.3,
        checks=("agree",),
    ),
    Goal(  # 1.5 s where a fresh `import torch` takes the anchor's 1 s, as a ratio to it here
        "startup",
        "first run(fn, 2, 'gloo') ≤ 1.5 s at the anchor's 1 s torch import: ≤ 1.5× a fresh "
        "`import torch` timed alongside",
        ("startup.first",),
        ("ratio",),
        1.5,
        checks=("correct",),
    ),
    Goal(
        "startup",
        "repeated run(fn, 2, 'gloo') ≤ 10 ms",
        ("startup.repeated",),
        ("seconds",),
        0.010,
        checks=("correct",),
    ),
    Goal(
        "grading",
        "one submission's grading ≤ 2× its floor (one interpreter running its code once), "
        "every assignment",
        (
            "grading.parts.check_yourself",
            "grading.parts.sharded",
            "grading.parts.training",
            "grading.parts.pipeline",
        ),
        ("ratio",),
        2.0,
        checks=("graded",),
    ),
    Goal(
        "grading",
        "1,000 check_yourself submissions ≤ 1 hour with 2 workers",
        ("grading.class",),
        ("seconds",),
        3600.0,
    ),
    Goal(
        "grading",
        "sandboxed grading ≤ 1.15× the same batch with --no-sandbox, identical grades",
        ("grading.sandbox",),
        ("ratio",),
        1.15,
        checks=("identical_grades",),
    ),
    Goal(
        "grading",
        "batch with 2 workers ≥ 1.8× sequential, identical grades",
        ("grading.batch",),
        ("ratio",),
        1.8,
        at_most=False,
        checks=("identical_grades", "all_graded"),
    ),
)


def field_value(row: Row, field: str) -> Any:
    """``row[field]``, or the extra field of that name."""
    return row[field] if field in row else row["extra"].get(field)


def judge(goal: Goal, rows: Iterable[Row]) -> Verdict:
    """The verdict of ``goal`` on the measured ``rows``."""
    covered = [r for r in rows if r["key"] in goal.keys]
    values = [(field_value(r, f), r["key"], f) for r in covered for f in goal.fields]
    values = [v for v in values if v[0] is not None]
    if not values:
        return Verdict(goal, None, None, None, None)
    value, key, field = max(values) if goal.at_most else min(values)
    within = value <= goal.limit if goal.at_most else value >= goal.limit
    failed = tuple(
        sorted({c for r in covered for c in goal.checks if r["extra"].get(c) is not True})
    )
    return Verdict(goal, value, key, field, within and not failed, failed)


def judge_all(rows: Sequence[Row], goals: Sequence[Goal] = GOALS) -> list[Verdict]:
    """One verdict per goal."""
    return [judge(goal, rows) for goal in goals]
