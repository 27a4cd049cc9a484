"""Pipeline parallelism: the pipelined step against one process, and the bubble measured.

The model is :func:`chainrule.parallel.pipeline.random_model`, a tanh MLP of square layers cut
into P stages; one step is the forward and backward of m micro-batches (1F1B, the runner
:func:`~chainrule.parallel.pipeline.run_stage`, one stage per rank), against the same step on
one process: lesson 6's gradient accumulation loop (one backward per micro-batch, added into the
same ``.grad``), the arithmetic the pipeline runs.

- **step, simulated world** (P = 2, 4, float64): ``pp.pipeline_step`` against the loop, both in
  this process, alternating. The simulated ranks take turns in one thread, so the ratio is what
  the send/recv rows and the runner add to the same arithmetic; *agree*: the gradients equal one
  process's (``pp.one_process_step``) within 1e-12 relative to each gradient's largest entry.
- **step, gloo** (P = 2, float32): rank 0's time between two barriers around its stage's step
  (process start and the call's dispatch left out), against the float32 loop on one process,
  alternating; *agree*: within 1e-5 relative of the float64 gradients.
- **message, gloo**: one message of a small float32 tensor between 2 processes (half a
  ping-pong), ``chainrule.dist.send``/``recv`` (which first agree on the pair in the process
  group's store) against raw ``torch.distributed.send``/``recv``, alternating on the same ranks.
  A pipelined step sends ``2(P − 1)m`` of them: this row explains most of the gloo step's ratio.
- **bubble, gloo** (P = 2, m = 1, 4, 8, float32, wider layers so that computing outweighs the
  messages): with two processes on two cores the stages really overlap, so the bubble is
  measured from the wall clock. The whole step on one process takes T₁; P stages that never
  waited would take T₁/P; the pipelined step takes T. The measured idle share is
  ``1 − T₁/(P·T)`` (the messages, the last stage's loss and any other work on the machine
  included), against ``(P − 1)/(m + P − 1)``. *slots*: the bubble of the order the runner ran,
  each action one slot (:func:`~chainrule.parallel.pipeline.timeline`), the formula exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import Row, make_row, median, paired_ratio

SIM_STAGES = (2, 4)
GLOO_STAGES = 2
BUBBLE_MICRO_BATCHES = (1, 4, 8)


def problem(
    stages: int, layers: int, width: int, rows: int, micro: int, seed: int = 0
) -> tuple[Any, list[np.ndarray], list[np.ndarray]]:
    """A model of ``stages`` × ``layers`` layers of ``width``, and ``micro`` micro-batches of
    ``rows`` rows with their targets."""
    from chainrule.parallel import pipeline as pp

    rng = np.random.default_rng(seed + 1)
    inputs = [rng.standard_normal((rows, width)) for _ in range(micro)]
    targets = [rng.standard_normal((rows, width)) for _ in range(micro)]
    return pp.random_model(stages, layers, width, seed=seed), inputs, targets


def accumulated(
    model: Sequence[Sequence[Any]], inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray],
    dtype: Any,
) -> list[list[np.ndarray]]:  # fmt: skip
    """One process, micro-batch after micro-batch, one backward each into the same ``.grad``:
    every stage's gradients."""
    from chainrule import Tensor
    from chainrule.parallel import pipeline as pp

    layers = [
        [
            (
                Tensor(np.asarray(w, dtype), requires_grad=True),
                Tensor(np.asarray(b, dtype), requires_grad=True),
            )
            for w, b in stage
        ]
        for stage in model
    ]
    m = len(inputs)
    for x, t in zip(inputs, targets, strict=True):
        y = Tensor(np.asarray(x, dtype))
        for s, stage in enumerate(layers):
            y = pp.forward_layers(stage, y, s == len(layers) - 1)
        (pp.squared_error(y, np.asarray(t, dtype)) * (1.0 / m)).backward()
    return [[np.asarray(p.grad) for layer in stage for p in layer] for stage in layers]


def relative_error(gradients: Sequence[Sequence[np.ndarray]], reference: Any) -> float:
    """The largest difference, relative to the largest entry of each reference gradient."""
    return max(
        float(np.abs(g - r).max() / np.abs(r).max())
        for stage, ref in zip(gradients, reference, strict=True)
        for g, r in zip(stage, ref, strict=True)
    )


def _seconds(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def timed_stage(
    model: Any, inputs: Any, targets: Any, schedule: str, dtype: Any
) -> tuple[float, Any]:
    """SPMD body: this rank's stage step between two barriers; its seconds and its result."""
    from chainrule import dist
    from chainrule.parallel import pipeline as pp

    dist.barrier()
    start = time.perf_counter()
    result = pp.run_stage(model, inputs, targets, schedule, dtype)
    dist.barrier()
    return time.perf_counter() - start, result


def sim_rows(width: int, rows: int, micro: int, repeat: int) -> list[Row]:
    """The pipelined step on the simulated world against the loop on one process, float64."""
    from chainrule.parallel import pipeline as pp

    out = []
    for stages in SIM_STAGES:
        model, inputs, targets = problem(stages, 2, width, rows, micro)
        _, reference = pp.one_process_step(model, inputs, targets)
        piped, one, error = [], [], 0.0
        for _ in range(repeat):
            seconds, results = _seconds(pp.pipeline_step, model, inputs, targets, "1f1b")
            piped.append(seconds)
            one.append(_seconds(accumulated, model, inputs, targets, np.float64)[0])
            error = max(error, relative_error([r.gradients for r in results], reference))
        out.append(
            make_row(
                f"pipeline.step_sim.P{stages}",
                f"1F1B step, {stages} stages × 2 layers of width {width}, m = {micro} "
                f"micro-batches of {rows} rows: simulated world, float64",
                median(piped),
                median(one),
                "one process, the same micro-batches accumulated, float64",
                paired_ratio(piped, one),
                agree=error < 1e-12,
                relative_error=error,
            )
        )
    return out


def gloo_samples(
    model: Any, inputs: Any, targets: Any, repeat: int
) -> tuple[list[float], list[float], list[Any]]:
    """``repeat`` pipelined steps on 2 gloo ranks (rank 0's time) alternating with the float32
    loop on one process; the two lists of seconds and the last step's results."""
    from chainrule import dist

    args = (model, inputs, targets, "1f1b", np.float32)
    dist.run(timed_stage, GLOO_STAGES, backend="gloo", args=args, timeout=600)  # warm-up
    piped, one, results = [], [], []
    for _ in range(repeat):
        ranks = dist.run(timed_stage, GLOO_STAGES, backend="gloo", args=args, timeout=600)
        piped.append(ranks[0][0])
        results = [result for _, result in ranks]
        one.append(_seconds(accumulated, model, inputs, targets, np.float32)[0])
    return piped, one, results


def gloo_step_rows(width: int, rows: int, micro: int, repeat: int) -> list[Row]:
    """The pipelined step on 2 gloo processes against the loop on one process, float32."""
    from chainrule.parallel import pipeline as pp

    model, inputs, targets = problem(GLOO_STAGES, 2, width, rows, micro)
    _, reference = pp.one_process_step(model, inputs, targets)
    piped, one, results = gloo_samples(model, inputs, targets, repeat)
    error = relative_error([r.gradients for r in results], reference)
    return [
        make_row(
            f"pipeline.step_gloo.P{GLOO_STAGES}",
            f"1F1B step, {GLOO_STAGES} stages × 2 layers of width {width}, m = {micro} "
            f"micro-batches of {rows} rows: {GLOO_STAGES} gloo processes, float32",
            median(piped),
            median(one),
            "one process, the same micro-batches accumulated, float32",
            paired_ratio(piped, one),
            agree=error < 1e-5,
            relative_error=error,
        )
    ]


def message_samples(elements: int, calls: int, repeat: int) -> dict[str, list[float]]:
    """SPMD body on 2 ranks: seconds per message of ``calls`` ping-pongs, the wrapper's and the
    raw ones alternating, after one warm-up each."""
    import torch
    import torch.distributed as td
    from chainrule import dist

    peer = 1 - dist.rank()
    t = torch.zeros(elements, dtype=torch.float32)

    def wrapper() -> None:
        if dist.rank() == 0:
            dist.send(t, peer)
            dist.recv(peer)
        else:
            dist.send(dist.recv(peer), peer)

    def raw() -> None:
        if dist.rank() == 0:
            td.send(t, peer)
            td.recv(t, peer)
        else:
            td.recv(t, peer)
            td.send(t, peer)

    samples: dict[str, list[float]] = {"wrapper": [], "raw": []}
    for fn in (wrapper, raw):
        fn()
    for _ in range(repeat):
        for name, fn in (("wrapper", wrapper), ("raw", raw)):
            td.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / (2 * calls))
    return samples


def message_rows(elements: int, calls: int, repeat: int) -> list[Row]:
    """One message on gloo: the wrapper's send and recv against torch.distributed's."""
    from chainrule import dist

    args = (elements, calls, repeat)
    samples = dist.run(message_samples, 2, backend="gloo", args=args, timeout=600)[0]
    return [
        make_row(
            f"pipeline.message_gloo.{4 * elements}B",
            f"one message of {4 * elements} bytes between 2 gloo processes: "
            "chainrule.dist.send / recv",
            median(samples["wrapper"]),
            median(samples["raw"]),
            "raw torch.distributed.send / recv",
            paired_ratio(samples["wrapper"], samples["raw"]),
            calls=calls,
        )
    ]


def bubble_rows(width: int, rows: int, layers: int, repeat: int) -> list[Row]:
    """The bubble of 2 gloo stages from the wall clock, ``1 − T₁/(P·T)``, for several m."""
    from chainrule.parallel import pipeline as pp

    out = []
    for micro in BUBBLE_MICRO_BATCHES:
        model, inputs, targets = problem(GLOO_STAGES, layers, width, rows, micro)
        piped, one, results = gloo_samples(model, inputs, targets, repeat)
        measured = [1 - t1 / (GLOO_STAGES * t) for t, t1 in zip(piped, one, strict=True)]
        order = [[pp.Action(a[0], int(a[1:])) for a in r.order] for r in results]
        formula = pp.bubble_formula(GLOO_STAGES, micro)
        out.append(
            make_row(
                f"pipeline.bubble_gloo.m{micro}",
                f"bubble of {GLOO_STAGES} gloo stages × {layers} layers of width {width}, "
                f"m = {micro}, micro-batches of {rows} rows, float32: the pipelined step",
                median(piped),
                median(one),
                "one process, the whole step (T₁)",
                paired_ratio(piped, one),
                bubble_measured=median(measured),
                bubble_formula=formula,
                bubble_slots=pp.timeline(order).bubble,
            )
        )
    return out


def collect(
    sim: tuple[int, int, int] = (64, 16, 8),
    gloo: tuple[int, int, int] = (64, 16, 8),
    bubble: tuple[int, int, int] = (384, 96, 4),
    repeat: int = 5,
) -> list[Row]:
    """Every row: ``sim`` and ``gloo`` as (width, rows, micro-batches), ``bubble`` as (width,
    rows, layers per stage)."""
    from chainrule import dist

    try:
        return (
            sim_rows(*sim, repeat=repeat)
            + gloo_step_rows(*gloo, repeat=repeat)
            + message_rows(gloo[0] * gloo[1], calls=20, repeat=repeat)
            + bubble_rows(*bubble, repeat=repeat)
        )
    finally:
        dist.shutdown()


def measure(quick: bool = False) -> list[Row]:
    """Every pipeline row (run it in a fresh process)."""
    if quick:
        return collect(sim=(32, 8, 4), gloo=(32, 8, 4), bubble=(192, 48, 2), repeat=2)
    return collect()
