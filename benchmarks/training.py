"""Training steps: the capstone's transformer on a 2 × 2 grid against one process.

Lesson 15 trains :mod:`chainrule.transformer` on four ranks as a data × tensor grid. One sample
is a whole training run of ``steps`` steps, in time per step: one process against the simulated
world of 4 ranks (float64, both in this process, alternating), and one process against 4 gloo
processes (float32; the gloo run timed on rank 0 between two barriers, so process start and the
call's dispatch are left out). *agree*: the grid's loss curve equals one process's (1e-10 in
float64; within the lesson's tolerance, four times float32's own rounding, on gloo).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.harness import Row, make_row, median, paired_ratio

DP, TP = 2, 2
TEXT = (
    "Reverse mode is a chain of vector-Jacobian products. Fan-out becomes a sum; "
    "concatenation becomes a split. Replication forward means summation backward. "
) * 8


def _training(dtype: str, steps: int, width: int) -> Any:
    from chainrule import transformer as tf

    chars = tf.vocabulary(TEXT)
    config = tf.Config(
        vocab=len(chars), context=16, width=width, heads=4, layers=2, hidden=2 * width, dtype=dtype
    )
    windows = tf.batches(tf.encode(TEXT, chars), steps, 8, config.context, seed=1)
    return tf.Training(config, tf.init_weights(config, seed=0), windows)


def _seconds(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def timed_grid(training: Any, dp: int, tp: int) -> tuple[float, list[float]]:
    """SPMD body: the seconds of a training run on this rank (between barriers), its curve."""
    from chainrule import dist
    from chainrule import transformer as tf

    dist.barrier()
    start = time.perf_counter()
    losses = tf.train_on_grid(training, dp, tp)
    dist.barrier()
    return time.perf_counter() - start, losses


def collect(steps: int, repeat: int, width: int = 32) -> list[Row]:
    """The capstone's rows: ``repeat`` alternating samples of ``steps``-step runs."""
    from chainrule import dist
    from chainrule import transformer as tf

    t64, t32 = _training("float64", steps, width), _training("float32", steps, width)
    samples: dict[str, list[float]] = {"one64": [], "sim": [], "one32": [], "gloo": []}
    gaps = {"sim": 0.0, "gloo": 0.0}
    rounding = 0.0
    try:
        dist.run(timed_grid, DP * TP, backend="gloo", args=(t32, DP, TP), timeout=600)  # warm
        for _ in range(repeat):
            seconds, one64 = _seconds(lambda: tf.train_one_process(t64))
            samples["one64"].append(seconds / steps)
            seconds, grid = _seconds(
                lambda: dist.run(tf.train_on_grid, DP * TP, args=(t64, DP, TP))
            )
            samples["sim"].append(seconds / steps)
            gaps["sim"] = max(gaps["sim"], float(np.abs(np.array(grid[0]) - one64).max()))
            seconds, one32 = _seconds(lambda: tf.train_one_process(t32))
            samples["one32"].append(seconds / steps)
            seconds, curve = dist.run(
                timed_grid, DP * TP, backend="gloo", args=(t32, DP, TP), timeout=600
            )[0]
            samples["gloo"].append(seconds / steps)
            gaps["gloo"] = max(gaps["gloo"], float(np.abs(np.array(curve) - one32).max()))
            rounding = max(rounding, float(np.abs(np.array(one32) - one64).max()))
    finally:
        dist.shutdown()
    label = f"capstone transformer step, width {width}, 2 layers, 8 × 16 tokens"
    return [
        make_row(
            "training.capstone_sim",
            f"{label}: 2 × 2 grid on the simulated world, float64",
            median(samples["sim"]),
            median(samples["one64"]),
            "one process, float64",
            paired_ratio(samples["sim"], samples["one64"]),
            agree=gaps["sim"] < 1e-10,
            steps=steps,
        ),
        make_row(
            "training.capstone_gloo",
            f"{label}: 2 × 2 grid on 4 gloo processes, float32",
            median(samples["gloo"]),
            median(samples["one32"]),
            "one process, float32",
            paired_ratio(samples["gloo"], samples["one32"]),
            agree=0 < rounding and gaps["gloo"] <= 4 * rounding,
            steps=steps,
        ),
    ]


def measure(quick: bool = False) -> list[Row]:
    """Every training row (run it in a fresh process: the worker pool starts here)."""
    return collect(4, 1) if quick else collect(20, 5)
