"""The simulated world's collectives against the memory limit: one memcpy of S bytes.

The unit is ``np.copyto(dst, src)`` of S = 64 MB into an array that already exists (a copy into
fresh memory also pays a page fault per 4 KB page, about 2× slower), timed in the same process,
alternating with the collective.

The floor of each collective, in memcpy units: the bytes that must be read (every rank's input
once) plus the bytes that must be written (every rank's output once), over the 2S bytes one
memcpy of S moves. With S the largest buffer of a rank (nccl-tests' "size") and P ranks:

=================  ==================  ===================  ==================
collective         read                written              floor (units)
=================  ==================  ===================  ==================
all_reduce         P inputs of S       P outputs of S       P
all_gather         P inputs of S/P     P outputs of S       (P + 1)/2
reduce_scatter     P inputs of S       P outputs of S/P     (P + 1)/2
all_to_all         P inputs of S       P outputs of S       P
=================  ==================  ===================  ==================

A simulated collective cannot beat its floor: every rank must get an array of its own.
The collective is timed as the wall time of a loop of calls on rank 0 between two barriers,
after one untimed call, divided by the number of calls. Every result is a new array, so its
pages are mapped afresh on first touch (about half a memcpy unit per 64 MB result).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness import Row, make_row, median, time_calls

MB = 1 << 20
WORLD = 4
DTYPE = np.float64


def floor_units(op: str, world: int) -> float:
    """The memcpy-count floor of ``op`` on ``world`` ranks (see the module docstring)."""
    return {
        "all_reduce": float(world),
        "all_gather": (world + 1) / 2,
        "reduce_scatter": (world + 1) / 2,
        "all_to_all": float(world),
    }[op]


def input_elements(op: str, size_bytes: int, world: int) -> int:
    """Elements of each rank's input so that the largest buffer of a rank is ``size_bytes``."""
    elements = size_bytes // np.dtype(DTYPE).itemsize
    return elements // world if op == "all_gather" else elements


def _collective(op: str) -> Callable[[np.ndarray], Any]:
    from chainrule import dist

    return {
        "all_reduce": dist.all_reduce,
        "all_gather": dist.all_gather,
        "reduce_scatter": dist.reduce_scatter,
        "all_to_all": dist.all_to_all,
    }[op]


def _timed_loop(inputs: list[np.ndarray], op: str, calls: int) -> tuple[float, float]:
    """SPMD body: one untimed call, then ``calls`` timed calls; wall seconds per call and the
    process's CPU seconds per call (all ranks' threads together), measured on rank 0."""
    from chainrule import dist

    collective = _collective(op)
    x = inputs[dist.rank()]
    result = collective(x)
    del result
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        result = collective(x)
        del result
    dist.barrier()
    return (time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls


def collective_seconds(op: str, inputs: list[np.ndarray], calls: int) -> tuple[float, float]:
    """Wall and CPU seconds per call of ``op`` in a simulated world of ``len(inputs)`` ranks."""
    from chainrule import dist

    return dist.run(_timed_loop, len(inputs), args=(inputs, op, calls))[0]


def rank_inputs(op: str, size_bytes: int, world: int) -> list[np.ndarray]:
    """Distinct inputs for the ranks (rank r holds r + 1)."""
    n = input_elements(op, size_bytes, world)
    return [np.full(n, r + 1.0, dtype=DTYPE) for r in range(world)]


def bandwidth_rows(
    size_bytes: int = 64 * MB, world: int = WORLD, repeat: int = 9, calls: int = 3
) -> list[Row]:
    """Each collective at ``size_bytes`` in memcpy units, paired with a memcpy sample."""
    src = np.random.default_rng(0).standard_normal(size_bytes // 8)
    dst = np.empty_like(src)
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        inputs = rank_inputs(op, size_bytes, world)
        copies, collectives = [], []
        for _ in range(repeat):
            copies.append(time_calls(lambda: np.copyto(dst, src), calls)[0])
            collectives.append(collective_seconds(op, inputs, calls)[0])
        units = [c / m for c, m in zip(collectives, copies, strict=True)]
        floor = floor_units(op, world)
        rows.append(
            make_row(
                f"sim.{op}.{size_bytes // MB}MB",
                f"sim {op}, P={world}, {size_bytes // MB} MB",
                median(collectives),
                median(copies),
                f"memcpy of {size_bytes // MB} MB",
                median(units),
                floor_units=floor,
                over_floor=median(units) / floor,
                memcpy_gb_s=size_bytes / median(copies) / 1e9,
            )
        )
        del inputs
    return rows


def small_call_rows(
    size_bytes: int = 1024, world: int = WORLD, repeat: int = 5, calls: int = 2000
) -> list[Row]:
    """Time per all_reduce call at ``size_bytes`` per rank: the cost of the rendezvous."""
    inputs = rank_inputs("all_reduce", size_bytes, world)
    samples = [collective_seconds("all_reduce", inputs, calls) for _ in range(repeat)]
    return [
        make_row(
            f"sim.all_reduce.{size_bytes}B",
            f"sim all_reduce, P={world}, {size_bytes} B: time per call",
            median(wall for wall, _ in samples),
            cpu_per_call_s=median(cpu for _, cpu in samples),
            calls=calls,
        )
    ]


def measure(quick: bool = False) -> list[Row]:
    """Every simulated-world row (run it in a fresh process)."""
    if quick:
        return bandwidth_rows(size_bytes=1 * MB, repeat=2, calls=2) + small_call_rows(
            repeat=2, calls=50
        )
    return bandwidth_rows() + small_call_rows()
