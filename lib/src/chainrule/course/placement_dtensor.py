"""Every redistribution of :mod:`chainrule.parallel.sharded` against ``torch.distributed.tensor``.

PyTorch's DTensor has the same placements (``Shard``, ``Replicate``, ``Partial``) and a
``redistribute`` whose backward moves the gradient back to the input's placement. For every
pair of placements on one mesh axis (sources Replicate, Shard(0), Shard(1), Partial; targets
Replicate, Shard(0), Shard(1): like DTensor, nothing redistributes *to* Partial) and for the
fanned-out targets, :func:`compare_with_dtensor` runs both on the same inputs and cotangents on
real processes and returns the largest differences of the outputs and of the input gradients.

The cotangent fed into the output has the output's cotangent placement: the slice of a global
cotangent for a Shard, the one replicated cotangent for a Replicate (counted once), and one
addend per rank for a fanned-out Replicate, which DTensor writes as a ``Partial`` gradient.
The outputs are compared rank by rank (both sides place them alike); the input gradients are
compared as global values, since the two may write the same gradient differently: the gradient
of a Partial input whose output fans out is a replicated sum here, and one addend per rank
(``Partial``) in DTensor.

Reliability: everything runs inside one ``dist.run`` per world size, on the pool of worker
processes that ``chainrule.dist`` keeps alive, in the process group those workers joined once.
The device mesh is made once per worker process over that group and kept; no process group is
made or destroyed here (a DTensor program that tears its group down was seen to abort now and
then in ``destroy_process_group``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from chainrule.parallel.placement import Partial, Placement, Replicate, Shard

SOURCES: tuple[Placement, ...] = (Replicate(), Shard(0), Shard(1), Partial())
TARGETS: tuple[Placement, ...] = (Replicate(), Shard(0), Shard(1))


@dataclass(frozen=True)
class Case:
    """One redistribution: ``source`` → ``target``, fanned out or not."""

    source: Placement
    target: Placement
    fan_out: bool = False

    def __str__(self) -> str:
        return f"{self.source} → {self.target}" + (", fanned out" if self.fan_out else "")


CASES: tuple[Case, ...] = (
    *(Case(s, t) for s in SOURCES for t in TARGETS),
    *(Case(s, Replicate(), fan_out=True) for s in SOURCES),
)
"""Every pair of placements, then every source into a fanned-out Replicate."""


@dataclass(frozen=True)
class Agreement:
    """How closely ``chainrule.parallel.sharded.redistribute`` and DTensor's agree on one case, over
    every rank: the largest absolute differences of the output and of the input gradient."""

    case: Case
    world_size: int
    output_error: float
    gradient_error: float


# -- inside each worker process --------------------------------------------------------------------

_meshes: dict[int, Any] = {}  # one device mesh per world size, kept for the life of the worker


def device_mesh(world_size: int) -> Any:
    """The 1-D DTensor device mesh over the ranks of this process's group, made once."""
    if world_size not in _meshes:
        from torch.distributed.device_mesh import DeviceMesh

        # DTensor names each fallback it takes (gloo has no all-to-all) at warning level.
        logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)
        _meshes[world_size] = DeviceMesh("cpu", list(range(world_size)))
    return _meshes[world_size]


def torch_placement(placement: Placement) -> Any:
    """The ``torch.distributed.tensor`` placement of the same name."""
    from torch.distributed import tensor as dtensor

    if isinstance(placement, Shard):
        return dtensor.Shard(placement.axis)
    return dtensor.Partial() if isinstance(placement, Partial) else dtensor.Replicate()


def _engine(case: Case, x_local: np.ndarray, g_local: np.ndarray) -> tuple[np.ndarray, ...]:
    from chainrule.parallel import sharded

    x = sharded.from_local(x_local, case.source, requires_grad=True)
    y = sharded.redistribute(x, case.target, fan_out=case.fan_out)
    y.local.backward(g_local)
    return y.local.data, x.full_grad()


def _dtensor(case: Case, x_local: np.ndarray, g_local: np.ndarray) -> tuple[np.ndarray, ...]:
    import torch
    from torch.distributed import tensor as dtensor

    mesh = device_mesh(torch.distributed.get_world_size())
    x: Any = dtensor.DTensor.from_local(  # a DTensor leaf (requires_grad_ is typed as Tensor's)
        torch.tensor(x_local), mesh, [torch_placement(case.source)], run_check=False
    ).requires_grad_(True)
    y = x.redistribute(mesh, [torch_placement(case.target)])
    grad_placement = dtensor.Partial() if case.fan_out else torch_placement(case.target)
    g = dtensor.DTensor.from_local(torch.tensor(g_local), mesh, [grad_placement], run_check=False)
    y.backward(g)
    assert x.grad is not None
    return y.to_local().detach().numpy(), x.grad.full_tensor().numpy()


def _compare_on_rank(shape: tuple[int, ...], seed: int) -> list[tuple[float, float]]:
    """SPMD on a torch backend: every case, both ways; this rank's (output, gradient) errors."""
    from chainrule import dist
    from chainrule.parallel import sharded

    world = dist.world_size()
    rng = np.random.default_rng(seed)
    found = []
    for case in CASES:  # every rank draws the same numbers in the same order
        value = rng.standard_normal(shape)
        addends = [rng.standard_normal(shape) for _ in range(world)]
        cotangent = rng.standard_normal(shape)
        cotangent_addends = [rng.standard_normal(shape) for _ in range(world)]
        x_local = sharded.local_part(value, case.source, addends)
        if case.fan_out:
            g_local = cotangent_addends[dist.rank()]
        else:
            g_local = sharded.local_part(cotangent, case.target)
        ours = _engine(case, x_local, g_local)
        theirs = _dtensor(case, x_local, g_local)
        found.append(tuple(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True)))
    return found  # type: ignore[return-value]


# -- in the caller ---------------------------------------------------------------------------------


def compare_with_dtensor(
    world_size: int, shape: tuple[int, int] | None = None, seed: int = 0, backend: str = "gloo"
) -> list[Agreement]:
    """Every case of :data:`CASES` on ``world_size`` processes of ``backend``: ours against
    DTensor's. ``shape`` (global, default ``(2P, 3P)``) must split into P slices on both axes."""
    from chainrule import dist

    shape = shape or (2 * world_size, 3 * world_size)
    per_rank = dist.run(_compare_on_rank, world_size, backend=backend, args=(shape, seed))
    return [
        Agreement(
            case,
            world_size,
            max(rank[i][0] for rank in per_rank),
            max(rank[i][1] for rank in per_rank),
        )
        for i, case in enumerate(CASES)
    ]
