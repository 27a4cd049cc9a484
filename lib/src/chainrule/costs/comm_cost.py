"""What a collective costs: the bytes each rank moves, and the α–β time model.

The bytes are the ring model's, which every collective's specification carries
(:mod:`chainrule.dist.collectives`): one rank sends ``bytes_factor · N`` for a tensor of N bytes.
The all-to-all's count assumes a **fully connected switch** (every rank sends at its full
bandwidth B at once); on a ring or a torus links are shared and the busiest one carries more:
about ``P/8 · N`` on a bidirectional ring, ``√P/8 · N`` on a 2-D torus
(:func:`all_to_all_link_bytes` routes every chunk and counts).

With α the latency of one step (seconds) and B the bandwidth (bytes per second), the time is
``steps · α + bytes / B`` (:func:`alpha_beta_time`): for an all-reduce
``2(P−1) α + 2(P−1)/P · N/B``. The bytes per rank stay below 2N however many ranks there are
(the ring is bandwidth-optimal), but the latency term grows linearly with P, while the compute
of each rank shrinks as 1/P: communication's share of a step grows with P.

:func:`event_bytes` applies the model to a :class:`chainrule.dist.CollectiveEvent` (whose
``nbytes`` is what one rank *contributes*: for an all-gather N/P), so a trace of a training step
counts its bytes (the model's, not bytes measured on a wire). :func:`fit` finds α and B from
measured times (:mod:`chainrule.course.timing`) by least squares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chainrule.dist.collectives import collective, ring_bytes


def bytes_factor(op: str, world_size: int) -> float:
    """Bytes one rank sends per byte of N (0 on one rank; see the module docstring)."""
    factor = collective(op).ring_factor
    return 0.0 if world_size == 1 else factor(world_size)


def steps(op: str, world_size: int) -> int:
    """Latency steps of the ring: ``2(P−1)`` for an all-reduce, ``P−1`` for the others (0 for a
    barrier, and on one rank)."""
    steps = collective(op).steps
    return 0 if world_size == 1 else steps(world_size)


def alpha_beta_time(
    op: str, nbytes: float, world_size: int, alpha: float, bandwidth: float
) -> float:
    """``steps · α + ring_bytes / B``: the model's time in seconds."""
    return steps(op, world_size) * alpha + ring_bytes(op, nbytes, world_size) / bandwidth


def whole_bytes(op: str, contributed: int, world_size: int) -> int:
    """N, the model's size, from the bytes one rank contributes (a trace event's ``nbytes``):
    an all-gather gathers P slices, the others take one rank's whole buffer (a rooted one, the
    source's)."""
    return contributed * world_size if collective(op).gathers else contributed


def event_bytes(event: Any) -> float:
    """Bytes one rank sends for a :class:`chainrule.dist.CollectiveEvent` (or one of
    :meth:`chainrule.dist.Trace.to_rows`), by the ring model."""
    if isinstance(event, Mapping):
        op, contributed, P = event["op"], int(event["nbytes"]), int(event["ranks"])
    else:
        op, contributed, P = event.op, int(event.nbytes), event.world_size
    return ring_bytes(op, whole_bytes(op, contributed, P), P)


def trace_bytes(events: Iterable[Any]) -> dict[str, float]:
    """Bytes one rank sends, by collective, over a trace (barriers left out)."""
    totals: dict[str, float] = {}
    for event in events:
        op = event["op"] if isinstance(event, Mapping) else event.op
        if op != "barrier":
            totals[op] = totals.get(op, 0.0) + event_bytes(event)
    return totals


# -- all-to-all on a network that is not a switch -----------------------------------------------

TOPOLOGIES = ("switch", "ring", "torus")
"""The networks :func:`all_to_all_link_bytes` knows: a fully connected switch, a bidirectional
ring, a square 2-D torus (a bidirectional ring along each of its two axes)."""


def bytes_by_axis(
    trace: Iterable[Any], groups: Mapping[str, Sequence[tuple[int, ...]]]
) -> list[dict[str, float]]:
    """The bytes each rank sends along each axis of a grid in ``trace`` (the ring model,
    :func:`event_bytes`). ``groups`` gives each axis's groups of ranks (for example
    :func:`chainrule.parallel.transformer_3d.grid_groups`); a collective counts for every rank
    of its group, on its group's axis, and a send for its source, on the axis whose group holds
    both ends. Groups of one rank send nothing."""
    axis_of = {tuple(ranks): axis for axis, of_axis in groups.items() for ranks in of_axis}
    world_size = 1 + max(rank for ranks in axis_of for rank in ranks)
    sent = [dict.fromkeys(groups, 0.0) for _ in range(world_size)]
    for event in trace:
        if event.op == "send":
            src, dst = event.kwargs["src"], event.kwargs["dst"]
            axis = next(
                (
                    a
                    for ranks, a in axis_of.items()
                    if src in ranks and dst in ranks and len(ranks) > 1
                ),
                None,
            )
            if axis is None:
                raise ValueError(f"send #{event.seq} from {src} to {dst}: no group holds both")
            sent[src][axis] += event_bytes(event)
        elif len(event.ranks) > 1:
            if event.ranks not in axis_of:
                raise ValueError(f"{event.op} #{event.seq} met the ranks {event.ranks}: no group")
            for rank in event.ranks:
                sent[rank][axis_of[event.ranks]] += event_bytes(event)
    return sent


def all_to_all_link_bytes(nbytes: float, world_size: int, topology: str = "switch") -> float:
    """Bytes on the busiest link (one direction) of an all-to-all of ``nbytes`` per rank.

    Every rank sends ``nbytes / P`` to each of the other P − 1 ranks. ``"switch"``: each rank
    has its own link into a non-blocking switch, so the busiest link carries one rank's
    ``(P−1)/P · N`` (what :func:`ring_bytes` assumes). ``"ring"``: ranks on a bidirectional
    ring, each chunk taking the shorter way round (half each way at distance P/2), so a link
    also carries the chunks of the pairs it lies between. ``"torus"``: a √P × √P torus, each
    chunk routed along the first axis, then the second (dimension-order routing). Every chunk
    is routed and every link's bytes are added up; the time is then ``this / B``.
    """
    P = world_size
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
    if P == 1:
        return 0.0
    chunk = nbytes / P
    if topology == "switch":
        return (P - 1) * chunk
    side = round(P**0.5)
    if topology == "torus" and side * side != P:
        raise ValueError(f"a square torus needs P to be a square, got {P}")
    shape = (P,) if topology == "ring" else (side, side)
    load: dict[tuple[tuple[int, ...], int, int], float] = {}  # (node, axis, ±1) → bytes

    def walk(at: list[int], axis: int, steps: int, direction: int, amount: float) -> None:
        here = list(at)
        for _ in range(steps):
            key = (tuple(here), axis, direction)
            load[key] = load.get(key, 0.0) + amount
            here[axis] = (here[axis] + direction) % shape[axis]

    for source in np.ndindex(*shape):
        for target in np.ndindex(*shape):
            if source == target:
                continue
            at = list(source)
            for axis, n in enumerate(shape):
                forward = (target[axis] - at[axis]) % n
                if forward == 0:
                    continue
                if 2 * forward < n:
                    walk(at, axis, forward, +1, chunk)
                elif 2 * forward > n:
                    walk(at, axis, n - forward, -1, chunk)
                else:  # as far one way as the other: half each way
                    walk(at, axis, forward, +1, chunk / 2)
                    walk(at, axis, forward, -1, chunk / 2)
                at[axis] = target[axis]
    return max(load.values())


# -- fitting α and B ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One timed collective: ``op`` on ``world_size`` ranks, N = ``nbytes``, median ``seconds``."""

    op: str
    world_size: int
    nbytes: int
    seconds: float


FIT_MEDIAN_ERROR, FIT_MAX_ERROR = 0.10, 0.25
"""The errors up to which a least-squares α and B are called a fit (:attr:`Fit.is_a_fit`)."""


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

    @property
    def is_a_fit(self) -> bool:
        """Whether the model describes the measurements: median relative error at most
        :data:`FIT_MEDIAN_ERROR` and largest at most :data:`FIT_MAX_ERROR`. Otherwise α and B
        are only the least-squares compromise of times the model cannot follow."""
        return (
            self.median_relative_error <= FIT_MEDIAN_ERROR
            and self.max_relative_error <= FIT_MAX_ERROR
        )


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
