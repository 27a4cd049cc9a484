"""Training steps: the capstone's transformer on a 2 × 2 grid, and the data-parallel exercise's
solution against PyTorch's DistributedDataParallel.

Lesson 15 trains :mod:`chainrule.transformer` on four ranks as a data × tensor grid. One sample
is a whole training run of ``steps`` steps, in time per step: one process against the simulated
world of 4 ranks (float64, both in this process, alternating), and one process against 4 gloo
processes (float32; the gloo run timed on rank 0 between two barriers, so process start and the
call's dispatch are left out). *agree*: the grid's loss curve equals one process's (1e-10 in
float64; within the lesson's tolerance, four times float32's own rounding, on gloo).

The exercise ``training/ex1_ddp_buckets`` has students write ``BucketedDataParallel``: gradients
all-reduced bucket by bucket from hooks during the backward pass. Its instructor solution (the
solution cells of ``source/``, run as they stand) is timed against
``torch.nn.parallel.DistributedDataParallel`` with the same bucket size on 2 gloo processes: one
sample is a training step (forward, mean squared error, backward, the wait for the gradients,
SGD) of the same MLP from the same weights, the two alternating on rank 0 after a barrier.
*agree*: after the timed steps both hold the same parameters on every rank.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, Row, make_row, median, paired_ratio

DP, TP = 2, 2
TEXT = (
    "Reverse mode is a chain of vector-Jacobian products. Fan-out becomes a sum; "
    "concatenation becomes a split. Replication forward means summation backward. "
) * 8


def _training(dtype: str, steps: int, width: int) -> Any:
    from chainrule.parallel import transformer as tf

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
    from chainrule.parallel import transformer as tf

    dist.barrier()
    start = time.perf_counter()
    losses = tf.train_on_grid(training, dp, tp)
    dist.barrier()
    return time.perf_counter() - start, losses


def collect(steps: int, repeat: int, width: int = 32) -> list[Row]:
    """The capstone's rows: ``repeat`` alternating samples of ``steps``-step runs."""
    from chainrule import dist
    from chainrule.parallel import transformer as tf

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


EXERCISE = REPO / "source" / "training" / "ex1_ddp_buckets.ipynb"
SOLUTION_CELLS = ("setup", "bucketed_data_parallel")


def solution_code(path: Path = EXERCISE) -> str:
    """The exercise's set-up and solution cells, the solution markers left out."""
    import nbformat

    cells = {
        cell.metadata.get("nbgrader", {}).get("grade_id"): cell.source
        for cell in nbformat.read(path, as_version=4).cells
    }
    lines = "\n\n".join(cells[name] for name in SOLUTION_CELLS).splitlines()
    return "\n".join(line for line in lines if "### BEGIN SOLUTION" not in line
                      and "### END SOLUTION" not in line)  # fmt: skip


def ddp_samples(code: str, width: int, layers: int, cap_bytes: int, steps: int, repeat: int) -> Any:
    """SPMD body: per-step seconds of the solution and of PyTorch's DDP on rank 0, alternating,
    and whether both end with the same parameters."""
    import torch
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel

    namespace: dict[str, Any] = {}
    exec(compile(code, str(EXERCISE), "exec"), namespace)  # noqa: S102 - the course's own solution

    def model() -> Any:
        torch.manual_seed(0)
        blocks = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
                  for _ in range(layers)]  # fmt: skip
        return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 1))

    torch.manual_seed(1 + td.get_rank())
    x, y = torch.randn(32, width), torch.randn(32, 1)
    ours = namespace["BucketedDataParallel"](model(), cap_bytes)
    theirs = DistributedDataParallel(model(), bucket_cap_mb=cap_bytes / 2**20)
    optimizers = {
        "ours": torch.optim.SGD(ours.parameters(), lr=1e-3),
        "ddp": torch.optim.SGD(theirs.parameters(), lr=1e-3),
    }

    def step(name: str) -> None:
        wrapped = ours if name == "ours" else theirs
        optimizers[name].zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        if name == "ours":
            ours.finish_gradient_synchronization()
        optimizers[name].step()

    samples: dict[str, list[float]] = {"ours": [], "ddp": []}
    for name in samples:
        step(name)  # warm up
    for _ in range(repeat):
        for name in samples:
            td.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step(name)
            samples[name].append((time.perf_counter() - start) / steps)
    same = all(
        torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(ours.module.parameters(), theirs.module.parameters(), strict=True)
    )
    return samples, same


def ddp_rows(width: int, layers: int, cap_bytes: int, steps: int, repeat: int) -> list[Row]:
    """The solution against DDP, on a gloo pool of 2 workers."""
    from chainrule import dist

    args = (solution_code(), width, layers, cap_bytes, steps, repeat)
    try:
        results = dist.run(ddp_samples, 2, backend="gloo", args=args, timeout=1800)
    finally:
        dist.shutdown()
    samples = results[0][0]
    parameters = layers * (width * width + width) + width + 1
    return [
        make_row(
            "training.ddp_buckets",
            f"data-parallel step of a {layers}-layer MLP of width {width} "
            f"({parameters * 4 / 2**20:.1f} MiB of float32 gradients), {cap_bytes / 2**20:g} MiB "
            "buckets, 2 gloo ranks: the exercise's BucketedDataParallel",
            median(samples["ours"]),
            median(samples["ddp"]),
            "torch DistributedDataParallel, the same bucket size",
            paired_ratio(samples["ours"], samples["ddp"]),
            agree=all(same for _, same in results),
        )
    ]


def measure(quick: bool = False) -> list[Row]:
    """Every training row (run it in a fresh process: the worker pool starts here)."""
    if quick:
        return collect(4, 1) + ddp_rows(64, 2, 1 << 14, 2, 1)
    return collect(20, 5) + ddp_rows(1024, 4, 1 << 20, 5, 15)
