"""What a collective costs: the bytes each rank moves, and the α–β time model.

Ring algorithms, on P ranks, for a tensor of N bytes (the *whole* tensor: the sum of an
all-reduce, the gathered result of an all-gather, the full input of a reduce-scatter):

- **all-gather**: P − 1 steps; in each, every rank passes one slice of N/P bytes on to its
  neighbour. Per rank: ``(P−1)/P · N`` bytes sent (and as many received).
- **reduce-scatter**: the same ring, adding instead of copying: ``(P−1)/P · N``.
- **all-reduce** = reduce-scatter then all-gather: 2(P − 1) steps, ``2(P−1)/P · N``.
- **all-to-all** of a buffer of N bytes per rank: every rank keeps 1/P of it and sends the rest,
  ``(P−1)/P · N``, in P − 1 exchanges.

With α the latency of one step (seconds) and B the bandwidth (bytes per second), the time is
``steps · α + bytes / B`` (:func:`alpha_beta_time`): for an all-reduce
``2(P−1) α + 2(P−1)/P · N/B``. The bytes do not grow with P: a ring all-reduce of N bytes moves
less than 2N per rank however many ranks there are, which is why it scales.

:func:`event_bytes` reads the per-rank bytes off a :class:`chainrule.dist.CollectiveEvent`
(whose ``nbytes`` is what one rank *contributes*: for an all-gather the slice, N/P), so the
bytes a training step moves can be counted from a trace of the step itself. :func:`fit` finds
α and B from measured times by least squares, and :func:`measure_collectives` measures
``torch.distributed``'s own collectives on gloo.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""The collectives the model covers, as :class:`chainrule.dist.Trace` names them."""


def bytes_factor(op: str, world_size: int) -> float:
    """Bytes one rank sends, per byte of N: ``2(P−1)/P`` for all-reduce, ``(P−1)/P`` for
    all-gather, reduce-scatter and all-to-all, 0 for a barrier (and on one rank)."""
    P = world_size
    if op == "barrier" or P == 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (P - 1) / P
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (P - 1) / P
    raise ValueError(f"no ring model for {op!r}; the model covers {', '.join(COLLECTIVES)}")


def steps(op: str, world_size: int) -> int:
    """Latency steps of the ring: ``2(P−1)`` for all-reduce, ``P−1`` for the others."""
    P = world_size
    if op == "barrier" or P == 1:
        return 0
    bytes_factor(op, P)  # the same operations
    return 2 * (P - 1) if op == "all_reduce" else P - 1


def ring_bytes(op: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends for ``op`` on a tensor of ``nbytes`` (see the module docstring)."""
    return bytes_factor(op, world_size) * nbytes


def alpha_beta_time(
    op: str, nbytes: float, world_size: int, alpha: float, bandwidth: float
) -> float:
    """``steps · α + ring_bytes / B``: the model's time in seconds."""
    return steps(op, world_size) * alpha + ring_bytes(op, nbytes, world_size) / bandwidth


def whole_bytes(op: str, contributed: int, world_size: int) -> int:
    """N, the model's size, from the bytes one rank contributes (a trace event's ``nbytes``):
    an all-gather gathers P slices, the others take one rank's whole buffer."""
    return contributed * world_size if op == "all_gather" else contributed


def event_bytes(event: Any) -> float:
    """Bytes one rank sends for a :class:`chainrule.dist.CollectiveEvent` (or one of
    :meth:`chainrule.dist.Trace.to_rows`), by the ring model."""
    if isinstance(event, Mapping):
        op, contributed, P = event["op"], int(event["nbytes"]), int(event["ranks"])
    else:
        op, contributed, P = event.op, int(event.nbytes), event.world_size
    if op == "barrier":
        return 0.0
    return ring_bytes(op, whole_bytes(op, contributed, P), P)


def trace_bytes(events: Iterable[Any]) -> dict[str, float]:
    """Bytes one rank sends, by collective, over a trace (barriers left out)."""
    totals: dict[str, float] = {}
    for event in events:
        op = event["op"] if isinstance(event, Mapping) else event.op
        if op != "barrier":
            totals[op] = totals.get(op, 0.0) + event_bytes(event)
    return totals


# -- fitting α and B ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One timed collective: ``op`` on ``world_size`` ranks, N = ``nbytes``, median ``seconds``."""

    op: str
    world_size: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class Fit:
    """α (seconds per step) and B (bytes per second) of one collective, fitted by least squares
    on the relative error, and the largest and median relative error of the fit."""

    op: str
    alpha: float
    bandwidth: float
    max_relative_error: float
    median_relative_error: float

    def predict(self, nbytes: float, world_size: int) -> float:
        return alpha_beta_time(self.op, nbytes, world_size, self.alpha, self.bandwidth)


def fit(measurements: Sequence[Measurement], op: str) -> Fit:
    """α and 1/B of ``op`` from its measurements, over every P and size at once.

    The model is linear in (α, 1/B): ``t = steps(P)·α + ring_bytes(N, P)·(1/B)``. Each equation
    is divided by its measured ``t``, so that a 1 KB call and a 64 MB call weigh the same
    (least squares on the relative error); a negative coefficient is clipped to a tiny value.
    """
    rows = [m for m in measurements if m.op == op]
    if len(rows) < 2:
        raise ValueError(f"fitting {op} needs at least two measurements, got {len(rows)}")
    design = np.array(
        [[steps(op, m.world_size), ring_bytes(op, m.nbytes, m.world_size)] for m in rows]
    )
    times = np.array([m.seconds for m in rows])
    weights = 1.0 / times
    solution, *_ = np.linalg.lstsq(design * weights[:, None], np.ones(len(rows)), rcond=None)
    alpha = max(float(solution[0]), 1e-9)
    inverse_bandwidth = max(float(solution[1]), 1e-15)
    predicted = design @ np.array([alpha, inverse_bandwidth])
    relative = np.abs(predicted - times) / times
    return Fit(
        op, alpha, 1.0 / inverse_bandwidth, float(relative.max()), float(np.median(relative))
    )


# -- measuring torch.distributed's collectives on gloo --------------------------------------------


def _raw_calls(td: Any, whole: Any, world_size: int) -> dict[str, Any]:
    """Each raw collective on a tensor of N = ``whole``'s bytes, its buffers made once."""
    import torch

    pieces = list(whole.chunk(world_size))  # views: the gathered slices land in ``whole``
    mine = torch.zeros_like(pieces[0])
    received = torch.empty_like(whole)
    return {
        "all_reduce": lambda: td.all_reduce(whole),
        "all_gather": lambda: td.all_gather(pieces, mine),
        "reduce_scatter": lambda: td.reduce_scatter(mine, pieces),
        "all_to_all": lambda: td.all_to_all_single(received, whole),
    }


def _time_on_rank(sizes: Sequence[int], ops: Sequence[str], repeat: int) -> list[tuple]:
    """SPMD (torch backend): the median seconds of each raw collective at each size, rank 0's."""
    import torch
    import torch.distributed as td

    P = td.get_world_size()
    results = []
    for nbytes in sizes:
        elements = max(P, nbytes // 4 // P * P)  # float32, divisible into P slices
        calls = _raw_calls(td, torch.zeros(elements, dtype=torch.float32), P)
        for op in ops:
            call = calls[op]
            call()  # warm-up: the first call of a size sets up buffers
            samples = []
            for _ in range(repeat):
                td.barrier()
                start = time.perf_counter()
                call()
                samples.append(time.perf_counter() - start)
            results.append((op, P, elements * 4, float(np.median(samples))))
    return results


def measure_collectives(
    world_sizes: Sequence[int],
    sizes: Sequence[int],
    ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter"),
    repeat: int = 5,
    backend: str = "gloo",
    timeout: float = 600.0,
) -> list[Measurement]:
    """Time ``torch.distributed``'s own collectives (not this library's wrappers) on ``backend``
    for every world size and size (bytes of N); the median of ``repeat`` calls on rank 0.

    One ``dist.run`` per world size, on the warm pool of worker processes.
    """
    from chainrule import dist

    found = []
    for P in world_sizes:
        args = (tuple(sizes), tuple(ops), repeat)
        rows = dist.run(_time_on_rank, P, backend=backend, args=args, timeout=timeout)[0]
        found += [Measurement(*row) for row in rows]
    return found
