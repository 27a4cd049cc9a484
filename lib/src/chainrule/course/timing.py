"""Timing torch.distributed's own collectives on gloo (lesson 12), for
:func:`chainrule.costs.comm_cost.fit`, and what gloo runs for each (:func:`gloo_works`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from chainrule import dist
from chainrule.costs.comm_cost import Measurement

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
    """SPMD (torch backend): the median seconds of each raw collective at each size, rank 0's;
    the collectives are called in turn within each repeat, so that they are compared under the
    same load."""
    import torch
    import torch.distributed as td

    P = td.get_world_size()
    results = []
    for nbytes in sizes:
        elements = max(P, nbytes // 4 // P * P)  # float32, divisible into P slices
        calls = _raw_calls(td, torch.zeros(elements, dtype=torch.float32), P)
        for op in ops:
            calls[op]()  # warm-up: the first call of a size sets up buffers
        samples: dict[str, list[float]] = {op: [] for op in ops}
        for _ in range(repeat):  # the collectives take turns, so a busy moment slows them all
            for op in ops:
                td.barrier()
                start = time.perf_counter()
                calls[op]()
                samples[op].append(time.perf_counter() - start)
        results += [(op, P, elements * 4, float(np.median(samples[op]))) for op in ops]
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
    found = []
    for P in world_sizes:
        args = (tuple(sizes), tuple(ops), repeat)
        rows = dist.run(_time_on_rank, P, backend=backend, args=args, timeout=timeout)[0]
        found += [Measurement(*row) for row in rows]
    return found


# -- what gloo runs -------------------------------------------------------------------------------


def _gloo_works_on_rank(
    ops: Sequence[str], elements: int
) -> list[tuple[str, list[tuple[str, list[int]]]]]:
    """SPMD (torch backend): each raw call under the profiler; the gloo works it ran, rank 0's."""
    import torch
    import torch.distributed as td

    P = td.get_world_size()
    elements = elements // P * P
    calls = _raw_calls(td, torch.zeros(elements, dtype=torch.float32), P)
    calls["reduce_scatter_single"] = lambda: td.reduce_scatter_single(
        torch.zeros(elements // P), torch.zeros(elements)
    )
    found = []
    for op in ops:
        calls[op]()  # warm-up, outside the record
        td.barrier()
        # the autograd profiler without Kineto: it records the same gloo works, and starts at
        # once (Kineto's first start takes seconds)
        with torch.autograd.profiler.profile(record_shapes=True, use_kineto=False) as profile:
            calls[op]()
        works = [
            (event.name.removeprefix("gloo:"), [int(np.prod(s)) for s in event.input_shapes])
            for event in profile.function_events
            if event.name.startswith("gloo:")
        ]
        found.append((op, works))
    return found


def gloo_works(
    ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_single"),
    world_size: int = 3,
    elements: int = 3 << 10,
    timeout: float = 120.0,
) -> dict[str, list[tuple[str, list[int]]]]:
    """What ProcessGroupGloo runs for one call of each of ``torch.distributed``'s ``ops`` on a
    float32 tensor of ``elements`` (N = 4·elements bytes): the gloo works that
    PyTorch's profiler records on rank 0, in order, each with the element counts of its tensors.

    ``"reduce_scatter"`` is ``torch.distributed.reduce_scatter`` on a list of P slices (what
    :func:`measure_collectives` times), ``"reduce_scatter_single"`` the one-tensor form.
    ProcessGroupGloo runs neither as a ring reduce-scatter: the first is one all-reduce of a
    copy of each of the P slices (N/P elements each), the second one all-reduce of a copy of
    all N elements, of which the rank keeps its slice; both move an all-reduce's bytes.
    ``elements`` is rounded down to a multiple of P.
    """
    rows = dist.run(
        _gloo_works_on_rank, world_size, backend="gloo", args=(tuple(ops), elements),
        timeout=timeout,
    )[0]  # fmt: skip
    return dict(rows)
