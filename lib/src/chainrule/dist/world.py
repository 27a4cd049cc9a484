"""The bottom of :mod:`chainrule.dist`: the world that answers a collective, ``ReduceOp``, errors.

A collective called inside ``dist.run(..., backend="sim")`` meets the simulated rank running
there (each rank runs in a greenlet and a ``contextvars`` context of its own); inside a worker of
``dist.run`` on gloo or nccl, or after ``dist.init_from_env`` under torchrun, that process's
torch.distributed rank; anywhere else a ``torch.distributed`` default process group is
initialised, that group. Outside all three it raises :class:`NoWorldError` (there is no implicit
world of one rank). The backends implement :class:`World`; none of them imports the API.
"""

from __future__ import annotations

import enum
import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from chainrule.dist.calls import Call
    from chainrule.dist.groups import Group

# -- what went wrong, on which rank, in which collective --------------------------------------


class CollectiveError(RuntimeError):
    """The ranks could not complete a collective together.

    Raised for ranks that call different collectives at the same step, mismatched shapes or
    dtypes, a rank that returned while others wait for it, and timeouts (the message names the
    ranks that never arrived). A collective numbered ``#k`` is the k-th collective of the run,
    counted from 0, the same number as ``Trace`` events' ``seq``.
    """


class CollectiveAborted(CollectiveError):
    """Raised inside a rank's collective when the run already failed elsewhere (another rank
    raised, or the ranks disagreed): it releases the rank, and is not itself the failure."""


class RankError(RuntimeError):
    """An exception raised by the SPMD function on one rank, re-raised in the caller.

    ``rank`` is the rank that raised, ``exc_type`` the name of the original exception's type and
    ``traceback_text`` its formatted traceback (also part of the message, so that it shows in a
    notebook even when the original exception object could not be brought back).
    """

    def __init__(self, rank: int, exc_type: str, message: str, traceback_text: str) -> None:
        self.rank = rank
        self.exc_type = exc_type
        self.original_message = message
        self.traceback_text = traceback_text
        super().__init__(
            f"rank {rank} raised {exc_type}: {message}\n\n"
            f"Traceback on rank {rank}:\n{traceback_text.rstrip()}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.rank, self.exc_type, self.original_message, self.traceback_text),
        )


class NoWorldError(RuntimeError):
    """A collective, ``rank()`` or ``world_size()`` was called outside any SPMD function.

    There is no implicit world of one rank: a collective outside ``dist.run`` (or outside a
    process group started by ``dist.init_from_env`` under torchrun) is a mistake worth seeing.
    """


class ReduceOp(enum.Enum):
    """How ``all_reduce`` and ``reduce_scatter`` combine the ranks' values.

    ``SUM``: Σ_r x_r. ``AVG``: (1/P) Σ_r x_r (floating point only). ``MAX``: elementwise max_r x_r.
    """

    SUM = "sum"
    AVG = "avg"
    MAX = "max"

    @classmethod
    def coerce(cls, op: ReduceOp | str) -> ReduceOp:
        """``op`` as a ReduceOp; also accepts the names ``"sum"``, ``"avg"``, ``"max"``."""
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            try:
                return cls(op.lower())
            except ValueError:
                pass
        choices = ", ".join(f"ReduceOp.{m.name}" for m in cls)
        raise ValueError(f"unknown reduction {op!r}; use one of {choices}")


# -- the world that answers a collective ------------------------------------------------------


class World(Protocol):
    """One rank of a backend, as the collectives see it: ``native``, the arrays it computes with
    (``"numpy"``, or ``"torch"`` on ``device``). :meth:`collective` meets the other ranks in
    ``call`` with this rank's ``data`` (a native array, or None); it returns this rank's result
    and the agreed call; :meth:`point_to_point` meets one other rank. ``into``: a native array
    sharing all_reduce's ``out=`` memory, which the backend may write the result into."""

    backend: str
    rank: int
    world_size: int
    native: str
    device: Any

    def collective(self, call: Call, data: Any, into: Any = None) -> tuple[Any, Call]: ...

    def point_to_point(self, call: Call, data: Any) -> tuple[Any, Call]:
        """Meet the peer of a ``send`` (``data``: what it sends) or a ``recv`` (``data``: None);
        the received array (None for a send) and the sender's call. Its ranks are the world's;
        a group's world carries the message in that group (the call's ``group``)."""

    def register_group(self, group: Group) -> None:
        """Prepare the collectives of ``group`` (called on every rank, in the same order)."""

    def subgroup(self, group: Group) -> World:
        """This rank as a rank of ``group``, whose collectives meet only its ranks."""


_rank_world: ContextVar[World | None] = ContextVar("chainrule_rank_world", default=None)
"""The simulated rank running in the current context (each rank has a context of its own)."""
_process_world: World | None = None  # a torch.distributed rank owning this process


def set_rank_world(world: World | None) -> None:
    """Make ``world`` answer the collectives called in the current context (None: stop)."""
    _rank_world.set(world)


def set_process_world(world: World | None) -> None:
    """Make ``world`` answer the collectives of every thread of this process (None: stop)."""
    global _process_world
    _process_world = world


def _chainrule_world() -> World | None:
    """The rank of a world that ``dist.run`` or ``init_from_env`` started here, if any."""
    world = _rank_world.get()
    return world if world is not None else _process_world


def current_world() -> World:
    """The world that answers a collective called here (see the module docstring)."""
    world = _chainrule_world()
    if world is not None:
        return world
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is not None and torch_dist.is_available() and torch_dist.is_initialized():
        from chainrule.dist import torchrun

        return torchrun.default_group_world()
    raise NoWorldError(
        "no distributed world here: rank(), world_size() and the collectives work only inside "
        "a function started by dist.run(fn, world_size, ...), or in a process that called "
        "dist.init_from_env() (e.g. under torchrun)"
    )


def group_world(group: Group | None) -> World:
    """The world of ``group`` seen from here (the whole world for None)."""
    world = current_world()
    return world if group is None else world.subgroup(group)


def in_world() -> bool:
    """Whether a collective called here would find a world (instead of raising NoWorldError)."""
    try:
        current_world()
    except NoWorldError:
        return False
    return True


def refuse_nested_run() -> None:
    """Raise CollectiveError when called inside an SPMD function: ranks start no worlds."""
    outer = _chainrule_world()
    if outer is not None:
        raise CollectiveError(
            f"dist.run was called inside an SPMD function, on rank {outer.rank} of a "
            f"{outer.backend} world of {outer.world_size}: a rank cannot start a world of its "
            "own; call dist.run once, outside the function, and the collectives inside it"
        )
