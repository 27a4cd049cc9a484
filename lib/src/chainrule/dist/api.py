"""One API over several backends: the collective functions, their dispatch and conversions.

An SPMD function ("single program, multiple data") runs once per rank and calls the same
collectives in the same order on every rank. Which implementation answers a call depends on
where the call runs:

1. inside :func:`run` with ``backend="sim"``: the simulated world of the running rank (each
   rank runs in its own greenlet and ``contextvars`` context);
2. inside a worker process of :func:`run` with ``backend="gloo"``/``"nccl"``, or after
   :func:`chainrule.dist.init_from_env` under torchrun: ``torch.distributed``;
3. anywhere else a ``torch.distributed`` default process group is initialised: that group.

Outside all three, :func:`rank`, :func:`world_size` and every collective raise
:class:`~chainrule.dist.errors.NoWorldError` (there is no implicit world of one rank).

Values: numpy arrays, :class:`chainrule.Tensor` (the collective reads ``.data`` and returns a
NEW tensor with no graph; differentiable collectives live in :mod:`chainrule.duality`), torch
tensors and Python numbers or lists (which become numpy arrays, so a float comes back as a
0-d array). Every collective is functional: it returns its result and never mutates its input.
"""

from __future__ import annotations

import enum
import importlib.util
import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol

import numpy as np

from chainrule.dist.errors import NoWorldError

BACKENDS = ("sim", "gloo", "nccl")
"""The backend names :func:`run` accepts besides ``"auto"`` (alias ``"torch"``)."""


class ReduceOp(enum.Enum):
    """How :func:`all_reduce` and :func:`reduce_scatter` combine the ranks' values.

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


# -- conversions ------------------------------------------------------------------------------

Restore = Callable[[np.ndarray], Any]
"""Turns a numpy result back into the type of the input it answers."""


def _chainrule_tensor_type() -> type | None:
    # The Tensor class, if chainrule.tensor is loaded; a value can't be a Tensor otherwise.
    module = sys.modules.get("chainrule.tensor")
    return getattr(module, "Tensor", None)


def _torch_module() -> Any:
    # torch, if it is already imported; a value can't be a torch tensor otherwise.
    return sys.modules.get("torch")


def is_chainrule_tensor(x: Any) -> bool:
    tensor_type = _chainrule_tensor_type()
    return tensor_type is not None and isinstance(x, tensor_type)


def is_torch_tensor(x: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def _as_array(array: np.ndarray) -> np.ndarray:
    return array


def _as_chainrule_tensor(array: np.ndarray) -> Any:
    return _chainrule_tensor_type()(array, dtype=array.dtype)


def torch_to_numpy(t: Any) -> np.ndarray:
    """A torch tensor's values as a numpy array (bfloat16, which numpy lacks, as float32)."""
    torch = _torch_module()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.resolve_conj().resolve_neg().numpy()


def _torch_restorer(like: Any) -> Restore:
    def restore(array: np.ndarray) -> Any:
        torch = _torch_module()
        return torch.from_numpy(array).to(device=like.device, dtype=like.dtype)

    return restore


def to_numpy(x: Any) -> tuple[np.ndarray | None, Restore]:
    """``x`` as a numpy array (no copy where possible) and the function that converts back.

    ``None`` (a non-source rank of broadcast or scatter) stays ``None``.
    """
    if type(x) is np.ndarray and x.dtype.kind in "biufc":  # the common case, first
        return x, _as_array
    if x is None:
        return None, _as_array
    if is_chainrule_tensor(x):
        return x.data, _as_chainrule_tensor
    if is_torch_tensor(x):
        return torch_to_numpy(x), _torch_restorer(x)
    array = np.asarray(x)
    if array.dtype.kind not in "biufc":
        raise TypeError(
            f"collectives move numbers; got a value of type {type(x).__name__} "
            f"(numpy dtype {array.dtype})"
        )
    return array, _as_array


def check_reducible(array: np.ndarray, op: ReduceOp) -> None:
    """Raise TypeError where ``op`` has no meaning for ``array``'s dtype."""
    kind = array.dtype.kind
    if kind in "bciu":
        check_reducible_kind(kind, array.dtype, op)


def check_reducible_kind(kind: str, dtype: Any, op: ReduceOp) -> None:
    """Raise TypeError where ``op`` has no meaning for a dtype of numpy kind ``kind``."""
    if kind == "b":
        raise TypeError(f"cannot reduce a boolean array with {op}; convert it to int or float")
    if op is ReduceOp.AVG and kind in "iu":
        raise TypeError(
            f"ReduceOp.AVG of an integer array ({dtype}) is not an integer; "
            "reduce with SUM and divide, or convert to float first"
        )
    if op is ReduceOp.MAX and kind == "c":
        raise TypeError("ReduceOp.MAX is not defined for complex numbers")


def normalize_axis(axis: int, ndim: int, what: str) -> int:
    """``axis`` in ``range(ndim)`` (negative axes count from the end), or IndexError."""
    if not isinstance(axis, int | np.integer) or isinstance(axis, bool):
        raise TypeError(f"{what} must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise IndexError(f"{what}={axis} is out of range for an array with {ndim} dimensions")
    return int(axis) % ndim


def check_src(src: int, world_size: int) -> int:
    """``src`` as the int rank it must be, or TypeError/ValueError."""
    if isinstance(src, bool) or not isinstance(src, int | np.integer):
        raise TypeError(f"src must be an int rank, got {src!r}")
    if not 0 <= src < world_size:
        raise ValueError(f"src={src} is not a rank of a world of size {world_size}")
    return int(src)


def check_divisible(value: Any, axis: int, world_size: int, op: str, what: str = "axis") -> int:
    """``axis`` of ``value`` (a numpy array or torch tensor), which must split into
    ``world_size`` equal chunks, one per rank; ValueError or IndexError otherwise."""
    if value.ndim == 0:
        raise ValueError(f"{op} needs an array with at least one dimension, got a 0-d value")
    axis = normalize_axis(axis, value.ndim, what)
    if value.shape[axis] % world_size:
        raise ValueError(
            f"{op}: {what}={axis} has length {value.shape[axis]}, which does not divide into "
            f"{world_size} equal chunks (one per rank)"
        )
    return axis


# -- dispatch ---------------------------------------------------------------------------------


class RankBackend(Protocol):
    """What one rank of a backend implements (inputs as the user passed them)."""

    def rank(self) -> int: ...
    def world_size(self) -> int: ...
    def all_reduce(self, x: Any, op: ReduceOp, out: Any = None) -> Any: ...
    def all_gather(self, x: Any, axis: int) -> Any: ...
    def reduce_scatter(self, x: Any, op: ReduceOp, axis: int) -> Any: ...
    def all_to_all(self, x: Any, split_axis: int, concat_axis: int) -> Any: ...
    def broadcast(self, x: Any, src: int) -> Any: ...
    def scatter(self, x: Any, src: int, axis: int) -> Any: ...
    def barrier(self) -> None: ...


_rank_backend: ContextVar[RankBackend | None] = ContextVar("chainrule_rank_backend", default=None)
"""The simulated rank running in the current context (each rank has a context of its own)."""
_process_backend: RankBackend | None = None  # a torch.distributed rank owning this process


def set_rank_backend(backend: RankBackend | None) -> None:
    """Make ``backend`` answer the collectives called in the current context (None: stop)."""
    _rank_backend.set(backend)


def set_process_backend(backend: RankBackend | None) -> None:
    """Make ``backend`` answer the collectives of every thread of this process (None: stop)."""
    global _process_backend
    _process_backend = backend


def current_backend() -> RankBackend:
    """The backend that answers a collective called here (see the module docstring)."""
    backend = _rank_backend.get()
    if backend is not None:
        return backend
    if _process_backend is not None:
        return _process_backend
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is not None and torch_dist.is_available() and torch_dist.is_initialized():
        from chainrule.dist import torch_backend

        return torch_backend.default_group_backend()
    raise NoWorldError(
        "no distributed world here: rank(), world_size() and the collectives work only inside "
        "a function started by dist.run(fn, world_size, ...), or in a process that called "
        "dist.init_from_env() (e.g. under torchrun)"
    )


def in_world() -> bool:
    """Whether a collective called here would find a world (instead of raising NoWorldError)."""
    try:
        current_backend()
    except NoWorldError:
        return False
    return True


# -- the collectives --------------------------------------------------------------------------


def rank() -> int:
    """This rank's index r ∈ {0, ..., P−1} inside an SPMD function."""
    return current_backend().rank()


def world_size() -> int:
    """The number of ranks P inside an SPMD function."""
    return current_backend().world_size()


def all_reduce(x: Any, op: ReduceOp | str = ReduceOp.SUM, out: Any = None) -> Any:
    """Every rank gets ⊕_r x_r (⊕ = sum, average or max), as the same type as ``x``.

    With ``op=SUM`` this is y = Σ_{r=0}^{P−1} x_r on every rank; its adjoint is itself.

    By default the result is a new array and ``x`` is left as it was. ``out``: write the
    result into ``out`` (an array of x's shape and dtype, which may be ``x`` itself: then it
    works in place like ``torch.distributed.all_reduce``) and return ``out``.
    """
    backend = current_backend()
    if type(op) is not ReduceOp:  # (a name; checking here saves a call per collective)
        op = ReduceOp.coerce(op)
    if out is None:
        return backend.all_reduce(x, op)
    return backend.all_reduce(x, op, out=out)


def all_gather(x: Any, axis: int = 0) -> Any:
    """Every rank gets concat(x_0, ..., x_{P−1}) along ``axis`` (shapes must be equal).

    A 0-d input counts as shape (1,), so gathering a scalar gives a vector of length P.
    The adjoint is :func:`reduce_scatter` (sum) along the same axis.
    """
    return current_backend().all_gather(x, axis)


def reduce_scatter(x: Any, op: ReduceOp | str = ReduceOp.SUM, axis: int = 0) -> Any:
    """Rank r gets chunk r (along ``axis``) of ⊕_j x_j; ``x.shape[axis]`` must divide by P.

    Equal to ``split(all_reduce(x, op), P, axis)[r]`` but moves (P−1)/P of the data once.
    """
    return current_backend().reduce_scatter(x, ReduceOp.coerce(op), axis)


def all_to_all(x: Any, split_axis: int = 0, concat_axis: int = 0) -> Any:
    """Split x into P chunks along ``split_axis``; chunk j goes to rank j.

    Rank r returns concat(chunk_r(x_0), ..., chunk_r(x_{P−1})) along ``concat_axis``: a
    transpose of the (rank, chunk) grid, e.g. from sharding a sequence to sharding heads.
    """
    return current_backend().all_to_all(x, split_axis, concat_axis)


def broadcast(x: Any = None, src: int = 0) -> Any:
    """Every rank gets a copy of rank ``src``'s x.

    The other ranks may pass None or an array of the source's shape and dtype.
    """
    return current_backend().broadcast(x, src)


def scatter(x: Any = None, src: int = 0, axis: int = 0) -> Any:
    """Rank r gets chunk r (along ``axis``) of rank ``src``'s x (other ranks may pass None)."""
    return current_backend().scatter(x, src, axis)


def barrier() -> None:
    """Wait until every rank has reached this point."""
    current_backend().barrier()


# -- choosing and starting a backend ----------------------------------------------------------


def is_available(backend: str) -> bool:
    """Whether ``run(..., backend=backend)`` can work here ("sim" always; "gloo" needs torch,
    "nccl" needs CUDA devices; "auto"/"torch" when gloo or nccl is)."""
    if backend == "sim":
        return True
    if backend in ("auto", "torch"):
        return is_available("gloo") or is_available("nccl")
    if backend not in BACKENDS:
        return False
    from chainrule.dist import torch_backend

    return torch_backend.backend_available(backend)


def available_backends() -> list[str]:
    """The backends of ``("sim", "gloo", "nccl")`` that work on this machine."""
    return [name for name in BACKENDS if is_available(name)]


def resolve_backend(backend: str, world_size: int) -> str:
    """The concrete backend for ``run``: "auto"/"torch" is nccl with a GPU per rank, else gloo."""
    if backend in ("auto", "torch"):
        from chainrule.dist import torch_backend

        return torch_backend.auto_backend(world_size)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {BACKENDS + ('auto',)}")
    if backend == "gloo" and importlib.util.find_spec("torch") is not None:
        # Importing torch here only to ask takes a second; the worker processes import it
        # anyway and report a torch without gloo when their process group fails to start.
        return backend
    if not is_available(backend):
        raise RuntimeError(
            f"backend {backend!r} is not available here; available: {available_backends()}"
        )
    return backend


def run(
    fn: Callable[..., Any],
    world_size: int,
    backend: str = "sim",
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    timeout: float | None = None,
    deterministic: bool = True,
    trace: Any = None,
) -> list:
    """Run ``fn(*args, **kwargs)`` once on each of ``world_size`` ranks; results in rank order.

    ``backend``: "sim" (greenlets in this thread, the default), "gloo" or "nccl" (one process
    per rank, kept alive between calls), "auto" (nccl with one GPU per rank, else gloo).
    ``timeout`` (seconds): on "sim" how long a rank may run its own code without reaching a
    collective (default :data:`chainrule.dist.simulated.DEFAULT_TIMEOUT`), on torch backends
    how long the whole call may take (default :data:`chainrule.dist.torch_backend.DEFAULT_TIMEOUT`).
    ``deterministic`` (sim only): every rank receives the same bits, reduced in rank order;
    False lets each rank sum in its own ring order, so results differ in the last bits.
    ``trace``: a :class:`~chainrule.dist.trace.Trace` that receives one event per collective.

    An exception on a rank is re-raised as :class:`~chainrule.dist.errors.RankError`; a
    mismatch, a rank that left early or a timeout as
    :class:`~chainrule.dist.errors.CollectiveError`.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int | np.integer):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    kwargs = dict(kwargs or {})
    name = resolve_backend(backend, int(world_size))
    if name == "sim":
        from chainrule.dist.simulated import SimulatedWorld

        world = SimulatedWorld(
            int(world_size), timeout=timeout, deterministic=deterministic, trace=trace
        )
        return world.run(fn, args, kwargs)
    from chainrule.dist import torch_backend

    return torch_backend.run(fn, int(world_size), name, args, kwargs, timeout, trace)
