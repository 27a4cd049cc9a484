"""Under torchrun: the process group torchrun describes, as this process's world.

torchrun starts one process per rank, on one machine or several, and describes the group in
environment variables. After :func:`init_from_env` the SPMD function calls the same
collectives as inside :func:`chainrule.dist.run`::

    torchrun --nproc-per-node=2 lib/examples/torchrun_data_parallel.py

A process whose default process group someone else initialised gets a world on that group the
first time it calls a collective (:func:`default_group_world`).
"""

from __future__ import annotations

import os
from typing import Any

from chainrule.dist.api import is_available
from chainrule.dist.torch_backend import TorchWorld
from chainrule.dist.world import set_process_world

_joined_here = False  # whether init_from_env initialised the default process group
_default_world: TorchWorld | None = None


def init_from_env(backend: str = "auto") -> TorchWorld:
    """Join the process group described by torchrun's environment; returns this rank.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``. ``backend="auto"`` is NCCL when this machine has a GPU for each of its
    local ranks, else gloo. With NCCL, rank tensors live on ``cuda:<LOCAL_RANK>``. Afterwards
    :func:`chainrule.dist.rank` and the collectives use this process group.
    """
    global _joined_here
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [v for v in needed if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_from_env() needs the environment torchrun sets ({', '.join(missing)} "
            "missing): start the script with `torchrun --nproc-per-node=2 script.py`, or run "
            "the SPMD function with dist.run(fn, world_size)"
        )
    import torch
    import torch.distributed as td

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if backend in ("auto", "torch"):
        nccl = is_available("nccl") and torch.cuda.device_count() >= local_world
        backend = "nccl" if nccl else "gloo"
    device = device_for(backend, local_rank)
    if not td.is_initialized():
        td.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
        _joined_here = True
    world = TorchWorld(backend, device)
    set_process_world(world)
    return world


def device_for(backend: str, local_rank: int) -> Any:
    """Where a rank's tensors live: ``cuda:<local rank>`` for NCCL (made current), else CPU."""
    import torch

    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def default_group_world() -> TorchWorld:
    """A world on a default process group that someone else initialised."""
    global _default_world
    import torch
    import torch.distributed as td

    if _default_world is None or _default_world.rank != td.get_rank():
        backend = str(td.get_backend())
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
        _default_world = TorchWorld(backend, device)
    return _default_world


def leave() -> None:
    """Leave the process group :func:`init_from_env` joined (nothing if it joined none)."""
    global _joined_here
    if _joined_here:
        import torch.distributed as td

        if td.is_initialized():
            td.destroy_process_group()
        _joined_here = False
        set_process_world(None)
