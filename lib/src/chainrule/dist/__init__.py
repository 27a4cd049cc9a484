"""Collectives with one API on a simulated world of P ranks or on torch.distributed.

>>> from chainrule import dist
>>> def step(x):
...     return dist.all_reduce(x * (dist.rank() + 1))
>>> dist.run(step, 4, args=(1.0,))          # four ranks, taking turns in this process
[array(10.), array(10.), array(10.), array(10.)]

The same function runs unchanged with ``backend="gloo"`` (one process per rank, CPU),
``backend="nccl"`` (one GPU per rank) and under torchrun after :func:`init_from_env`.

The modules: :mod:`~chainrule.dist.api` (the collectives, and ``run``),
:mod:`~chainrule.dist.calls` (what the ranks must agree on, and the check),
:mod:`~chainrule.dist.groups` (groups of ranks, and the 2-D grid of data × tensor parallelism),
:mod:`~chainrule.dist.simulated` (the simulated world), :mod:`~chainrule.dist.torch_backend`
(one rank on torch.distributed), :mod:`~chainrule.dist.pool` and
:mod:`~chainrule.dist.worker` (the warm worker processes of ``run``),
:mod:`~chainrule.dist.whereabouts` (what a stuck worker is waiting in, and its line),
:mod:`~chainrule.dist.torchrun`, :mod:`~chainrule.dist.trace` and
:mod:`~chainrule.dist.errors`.
"""

from chainrule.dist.api import (
    BACKENDS,
    ReduceOp,
    all_gather,
    all_reduce,
    all_to_all,
    auto_backend,
    available_backends,
    barrier,
    broadcast,
    in_world,
    is_available,
    rank,
    reduce_scatter,
    run,
    scatter,
    world_size,
)
from chainrule.dist.errors import CollectiveError, NoWorldError, RankError
from chainrule.dist.groups import Grid, Group, grid, new_group
from chainrule.dist.pool import shutdown
from chainrule.dist.simulated import SimulatedWorld
from chainrule.dist.torchrun import init_from_env
from chainrule.dist.trace import CollectiveEvent, Trace

__all__ = [
    "BACKENDS",
    "CollectiveError",
    "CollectiveEvent",
    "Grid",
    "Group",
    "NoWorldError",
    "RankError",
    "ReduceOp",
    "SimulatedWorld",
    "Trace",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "auto_backend",
    "available_backends",
    "barrier",
    "broadcast",
    "grid",
    "in_world",
    "init_from_env",
    "is_available",
    "new_group",
    "rank",
    "reduce_scatter",
    "run",
    "scatter",
    "shutdown",
    "world_size",
]
