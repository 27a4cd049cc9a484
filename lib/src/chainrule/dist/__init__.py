"""Collectives with one API on a simulated world of P ranks or on torch.distributed.

>>> from chainrule import dist
>>> def step(x):
...     return dist.all_reduce(x * (dist.rank() + 1))
>>> dist.run(step, 4, args=(1.0,))          # four ranks, taking turns in this process
[array(10.), array(10.), array(10.), array(10.)]

The same function runs unchanged with ``backend="gloo"`` (one process per rank, CPU),
``backend="nccl"`` (one GPU per rank) and under torchrun after :func:`init_from_env`.

The modules, lowest first: ``world`` (the world, ``ReduceOp``, the errors), ``collectives``
(one specification per collective), ``chunks``, ``trace``, ``calls`` (the ranks' agreement),
``api`` (the collectives, ``send`` and ``recv``, ``run``), ``groups``; the backends
``simulated`` and ``torch_backend`` (its sends and recvs: ``torch_pairs``); the worker
pools (``pool``, ``worker``, ``forks``, ``whereabouts``); ``torchrun``.
"""

from chainrule.dist.api import (
    BACKENDS,
    all_gather,
    all_reduce,
    all_to_all,
    auto_backend,
    available_backends,
    barrier,
    broadcast,
    is_available,
    rank,
    recv,
    reduce_scatter,
    run,
    scatter,
    send,
    world_size,
)
from chainrule.dist.groups import Grid, Group, grid, new_group
from chainrule.dist.pool import shutdown
from chainrule.dist.simulated import SimulatedWorld
from chainrule.dist.torchrun import init_from_env
from chainrule.dist.trace import CollectiveEvent, Trace
from chainrule.dist.world import CollectiveError, NoWorldError, RankError, ReduceOp, in_world

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
    "recv",
    "reduce_scatter",
    "run",
    "scatter",
    "send",
    "shutdown",
    "world_size",
]
