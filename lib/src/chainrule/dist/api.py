"""The collectives, one API over every backend, and ``run``.

Every collective checks its arguments and converts the value once (to a numpy array for the
simulated world, a torch tensor on the rank's device for torch.distributed), hands the world of
:func:`chainrule.dist.world.current_world` a :class:`~chainrule.dist.calls.Call` and that array,
and converts the result back to the kind passed: numpy arrays (a float comes back as a 0-d
array), :class:`chainrule.Tensor` (a NEW tensor with no graph; the differentiable collectives
are :mod:`chainrule.parallel.duality`) or torch tensors, on their device. Every collective is
functional (it leaves its input alone), except :func:`all_reduce` with ``out=``, and takes
``group=`` (:func:`~chainrule.dist.groups.new_group`): then it meets only that group's ranks,
and ``src`` and the chunks count in the group's ranks.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from chainrule.dist.calls import Call
from chainrule.dist.chunks import chunk_slice
from chainrule.dist.world import (
    ReduceOp,
    World,
    current_world,
    group_world,
    refuse_nested_run,
)
from chainrule.engine import interop

if TYPE_CHECKING:
    from chainrule.dist.groups import Group

BACKENDS = ("sim", "gloo", "nccl")
"""The backend names :func:`run` accepts besides ``"auto"`` (alias ``"torch"``)."""


# -- checks and conversions, once per call ----------------------------------------------------


def _prepare(world: World, op: str, x: Any, params: tuple[Any, ...]) -> tuple[Any, Call]:
    """``x`` as the world's native array, and this rank's :class:`Call` of ``op``."""
    if type(x) is np.ndarray and world.native == "numpy" and x.dtype.kind in "biufc":
        return x, Call(op, params, x.shape, interop.numpy_dtype_name(x.dtype), "numpy")
    kind, dtype = interop.kind_of(x), interop.dtype_name(x)
    if world.native == "numpy":
        data = interop.to_numpy(x)
    else:
        data = interop.to_torch(x, world.device)
    return data, Call(op, params, tuple(data.shape), dtype, kind)


def _result(result: Any, call: Call, like: Any) -> Any:
    """The world's ``result`` (of ``call``'s dtype) as the kind of value ``like`` is, on its
    device; as the kind the source passed when this rank passed None."""
    if type(result) is np.ndarray and type(like) is np.ndarray:
        return result
    if like is None:
        kind, device = call.kind, None
    else:
        kind = interop.kind_of(like)
        device = like.device if kind == "torch" else None
    return interop.restore(result, kind, call.dtype, device)  # type: ignore[arg-type]


@functools.cache
def check_reducible(dtype: str, op: ReduceOp) -> None:
    """Raise TypeError where ``op`` has no meaning for values of ``dtype`` (remembered when
    it has one: each collective asks)."""
    kind = interop.numpy_kind(dtype)
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


def check_divisible(
    shape: tuple[Any, ...], axis: int, world_size: int, op: str, what: str = "axis"
) -> int:
    """``axis`` of ``shape``, which must split into ``world_size`` equal chunks (one per rank)."""
    if not shape:
        raise ValueError(f"{op} needs an array with at least one dimension, got a 0-d value")
    axis = normalize_axis(axis, len(shape), what)
    chunk_slice(shape[axis], 0, world_size, f"{op}: {what}={axis}")
    return axis


def check_src(src: int, world_size: int) -> int:
    """``src`` as the int rank it must be, or TypeError/ValueError."""
    if isinstance(src, bool) or not isinstance(src, int | np.integer):
        raise TypeError(f"src must be an int rank, got {src!r}")
    if not 0 <= src < world_size:
        raise ValueError(f"src={src} is not a rank of a world of size {world_size}")
    return int(src)


# -- the collectives --------------------------------------------------------------------------


def rank(group: Group | None = None) -> int:
    """This rank's index r ∈ {0, ..., P−1} inside an SPMD function (in ``group``, if given)."""
    return group_world(group).rank


def world_size(group: Group | None = None) -> int:
    """The number of ranks P inside an SPMD function (of ``group``, if given)."""
    return group_world(group).world_size


def all_reduce(
    x: Any, op: ReduceOp | str = ReduceOp.SUM, out: Any = None, group: Group | None = None
) -> Any:
    """Every rank gets ⊕_r x_r (⊕ = sum, average or max), as the same type as ``x``.

    With ``op=SUM`` this is y = Σ_{r=0}^{P−1} x_r on every rank; its adjoint is itself.

    By default the result is a new array and ``x`` is left as it was. ``out``: write the
    result into ``out`` (an array of x's shape and dtype, which may be ``x`` itself: then it
    works in place like ``torch.distributed.all_reduce``) and return ``out``.
    """
    world = group_world(group)
    if type(op) is not ReduceOp:
        op = ReduceOp.coerce(op)
    data, call = _prepare(world, "all_reduce", x, (("op", op),))
    check_reducible(call.dtype, op)
    if out is None:
        return _result(world.collective(call, data)[0], call, x)
    interop.check_writable(out, "all_reduce")
    shape, dtype = tuple(out.shape), interop.dtype_name(out)
    if (shape, dtype) != (call.shape, call.dtype):
        raise ValueError(
            f"all_reduce: out has shape {shape} {dtype} but x has {call.shape} {call.dtype}; "
            "out must be like x"
        )
    into = interop.torch_view(out, world.device) if world.native == "torch" else None
    result, _ = world.collective(call, data, into)
    if result is not into:
        interop.copy_into(out, result)
    return out


def all_gather(x: Any, axis: int = 0, group: Group | None = None) -> Any:
    """Every rank gets concat(x_0, ..., x_{P−1}) along ``axis`` (shapes must be equal).

    A 0-d input counts as shape (1,), so gathering a scalar gives a vector of length P.
    The adjoint is :func:`reduce_scatter` (sum) along the same axis.
    """
    world = group_world(group)
    data, call = _prepare(world, "all_gather", x, ())
    if data.ndim == 0:
        data = data.reshape(1)
    axis = normalize_axis(axis, data.ndim, "axis")
    call = call._replace(params=(("axis", axis),), shape=tuple(data.shape))
    return _result(world.collective(call, data)[0], call, x)


def reduce_scatter(
    x: Any, op: ReduceOp | str = ReduceOp.SUM, axis: int = 0, group: Group | None = None
) -> Any:
    """Rank r gets chunk r (along ``axis``) of ⊕_j x_j; ``x.shape[axis]`` must divide by P.

    Equal to ``split(all_reduce(x, op), P, axis)[r]`` but moves (P−1)/P of the data once.
    """
    world = group_world(group)
    op = ReduceOp.coerce(op)
    data, call = _prepare(world, "reduce_scatter", x, ())
    check_reducible(call.dtype, op)
    axis = check_divisible(call.shape, axis, world.world_size, "reduce_scatter")  # type: ignore[arg-type]
    call = call._replace(params=(("op", op), ("axis", axis)))
    return _result(world.collective(call, data)[0], call, x)


def all_to_all(
    x: Any,
    split_axis: int = 0,
    concat_axis: int = 0,
    send_counts: Sequence[int] | None = None,
    recv_counts: Sequence[int] | None = None,
    group: Group | None = None,
) -> Any:
    """Split x into P chunks along ``split_axis``; chunk j goes to rank j.

    Rank r returns concat(chunk_r(x_0), ..., chunk_r(x_{P−1})) along ``concat_axis``: a
    transpose of the (rank, chunk) grid, e.g. from sharding a sequence to sharding heads.

    Uneven (torch's ``all_to_all_single`` with split sizes): ``send_counts[j]`` slices along
    ``split_axis`` go to rank j, so they sum to ``x.shape[split_axis]``, and what arrives is
    concatenated along the same axis (``concat_axis`` must equal ``split_axis``), in rank order:
    rank r receives ``recv_counts[j] = send_counts_j[r]`` slices from rank j. ``recv_counts``
    may be passed to have it checked; ranks that disagree raise CollectiveError.
    """
    world = group_world(group)
    data, call = _prepare(world, "all_to_all", x, ())
    shape: tuple[Any, ...] = call.shape  # type: ignore[assignment]
    P, params = world.world_size, cast(tuple[tuple[str, Any], ...], ())
    if send_counts is None:
        split_axis = check_divisible(shape, split_axis, P, "all_to_all", "split_axis")
    else:
        split_axis = normalize_axis(split_axis, len(shape), "split_axis")
        counts = [_counts(send_counts, P, "send_counts")]
        if recv_counts is not None:
            counts.append(_counts(recv_counts, P, "recv_counts"))
        if sum(counts[0]) != shape[split_axis]:
            raise ValueError(
                f"all_to_all: send_counts {counts[0]} sum to {sum(counts[0])}, but x has "
                f"{shape[split_axis]} slices along split_axis={split_axis}"
            )
        params = tuple(zip(("send_counts", "recv_counts"), counts, strict=False))
    concat_axis = normalize_axis(concat_axis, len(shape), "concat_axis")
    if params and concat_axis != split_axis:
        raise ValueError("an uneven all_to_all concatenates along its split_axis: pass both alike")
    axes = (("split_axis", split_axis), ("concat_axis", concat_axis))
    call = call._replace(params=axes + params)
    return _result(world.collective(call, data)[0], call, x)


def _counts(counts: Sequence[int], world_size: int, what: str) -> tuple[int, ...]:
    """``counts`` as a tuple of ``world_size`` ints ≥ 0, or ValueError."""
    found = tuple(int(c) for c in counts)
    if len(found) != world_size or min(found, default=0) < 0:
        raise ValueError(f"all_to_all: {what} must be {world_size} counts ≥ 0, got {counts!r}")
    return found


def broadcast(x: Any = None, src: int = 0, group: Group | None = None) -> Any:
    """Every rank gets a copy of rank ``src``'s x.

    The other ranks may pass None or an array of the source's shape and dtype.
    """
    world = group_world(group)
    src = check_src(src, world.world_size)
    if x is None:
        if world.rank == src:
            raise ValueError(f"broadcast: the source rank {src} must pass an array, not None")
        data, call = None, Call("broadcast", (("src", src),))
    else:
        data, call = _prepare(world, "broadcast", x, (("src", src),))
    result, source = world.collective(call, data)
    return _result(result, source, x)


def scatter(x: Any = None, src: int = 0, axis: int = 0, group: Group | None = None) -> Any:
    """Rank r gets chunk r (along ``axis``) of rank ``src``'s x (other ranks may pass None)."""
    world = group_world(group)
    src = check_src(src, world.world_size)
    if world.rank != src:  # only the source's value and axis count
        data, call = None, Call("scatter", (("src", src),))
    elif x is None:
        raise ValueError(f"scatter: the source rank {src} must pass an array, not None")
    else:
        data, call = _prepare(world, "scatter", x, ())
        axis = check_divisible(call.shape, axis, world.world_size, "scatter")  # type: ignore[arg-type]
        call = call._replace(params=(("src", src), ("axis", axis)))
    result, source = world.collective(call, data)
    return _result(result, source, x)


def barrier(group: Group | None = None) -> None:
    """Wait until every rank has reached this point."""
    group_world(group).collective(Call("barrier"), None)


# -- point to point ---------------------------------------------------------------------------


def send(
    x: Any, dst: int | None = None, group: Group | None = None, group_dst: int | None = None
) -> None:
    """Send ``x`` to rank ``dst``, which receives it with ``recv(src=<this rank>)``.

    The k-th send from rank s to rank d meets d's k-th recv from s (torch.distributed's
    order). A send returns once its recv has met it, on every backend: when every rank sends
    first, or every rank receives first, the ranks wait for each other, and the run ends in a
    CollectiveError that names the deadlock (never a hang); so does a send whose destination
    returns without receiving. The trace records one ``send`` event per message, its N bytes:
    the cost model's one step of N bytes.

    ``group`` (torch.distributed's arguments): the message travels in that group (on torch,
    its process group), and meets only a recv of the same group. ``dst`` is a rank of the
    world even then, as in ``torch.distributed.send``; ``group_dst`` names the destination by
    its rank in ``group`` instead (pass one of the two). Messages in different groups between
    the same two ranks are counted, and met, apart.
    """
    world = current_world()
    dst = _peer(world, group, dst, group_dst, "send", "dst")
    data, call = _prepare(world, "send", x, _pair_params(world.rank, dst, group))
    group_world(group).point_to_point(call, data)


def recv(
    src: int | None = None,
    shape: Sequence[int] | None = None,
    dtype: Any = None,
    group: Group | None = None,
    group_src: int | None = None,
) -> Any:
    """What rank ``src`` sends this rank with ``send(x, dst=<this rank>)``: a new array of the
    sender's shape and dtype, of the kind it sent (numpy, a :class:`chainrule.Tensor` without a
    graph, or a torch tensor on this rank's device).

    torch.distributed's ``recv`` fills a tensor the receiver made, so the receiver must know the
    shape and dtype beforehand; here they travel with the message instead (the sender's call,
    agreed before any data moves, as a broadcast's source's). ``shape`` and ``dtype``, when
    given, are what the receiver expects: a sender that sends anything else fails the run with
    a CollectiveError naming both. A recv whose source returns without sending, or that waits
    for a rank that waits for it, ends the run the same way.

    ``group``, ``group_src``: as :func:`send`'s ``group`` and ``group_dst`` (``src`` a rank of
    the world, ``group_src`` the source's rank in ``group``; one of the two).
    """
    world = current_world()
    src = _peer(world, group, src, group_src, "recv", "src")
    expected = Call(
        "recv",
        _pair_params(src, world.rank, group),
        None if shape is None else tuple(int(n) for n in shape),
        None if dtype is None else _dtype_name(dtype),
    )
    result, sent = group_world(group).point_to_point(expected, None)
    return _result(result, sent, None)


def check_peer(peer: int, world: World, op: str, what: str) -> int:
    """``peer`` as the int rank of another rank of ``world``, or TypeError/ValueError."""
    if isinstance(peer, bool) or not isinstance(peer, int | np.integer):
        raise TypeError(f"{op}: {what} must be an int rank, got {peer!r}")
    if not 0 <= peer < world.world_size:
        raise ValueError(f"{op}: {what}={peer} is not a rank of a world of size {world.world_size}")
    if peer == world.rank:
        raise ValueError(f"{op}: {what}={peer} is this rank: a rank cannot {op} to itself")
    return int(peer)


def _peer(
    world: World, group: Group | None, peer: int | None, group_peer: int | None, op: str, what: str
) -> int:
    """The world rank of a send's destination or a recv's source, given as ``peer`` (a world
    rank) or ``group_peer`` (its rank in ``group``), exactly one of them; or TypeError or
    ValueError."""
    if (peer is None) == (group_peer is None):
        given = "both" if peer is not None else "neither"
        raise ValueError(
            f"{op}: pass {what} (a rank of the world) or group_{what} (a rank of the group), "
            f"not {given}"
        )
    if group is None:
        return check_peer(peer if peer is not None else group_peer, world, op, what)  # type: ignore[arg-type]
    if world.rank not in group.ranks:
        raise ValueError(
            f"{op}: rank {world.rank} is not in the group of ranks {group.ranks}: only its "
            "members send and receive in it"
        )
    if peer is None:
        if isinstance(group_peer, bool) or not isinstance(group_peer, int | np.integer):
            raise TypeError(f"{op}: group_{what} must be an int rank, got {group_peer!r}")
        if not 0 <= group_peer < len(group):
            raise ValueError(
                f"{op}: group_{what}={group_peer} is not a rank of the group of ranks "
                f"{group.ranks}, of size {len(group)}"
            )
        if group.ranks[group_peer] == world.rank:
            raise ValueError(
                f"{op}: group_{what}={group_peer} is this rank: a rank cannot {op} to itself"
            )
        return group.ranks[group_peer]
    peer = check_peer(peer, world, op, what)
    if peer not in group.ranks:
        raise ValueError(
            f"{op}: {what}={peer} is not a rank of the group of ranks {group.ranks} (a rank of "
            f"the world, as in torch.distributed; group_{what} counts in the group)"
        )
    return peer


def _pair_params(src: int, dst: int, group: Group | None) -> tuple[tuple[str, Any], ...]:
    """A message's arguments: its world ranks, and its group's ranks when it travels in one."""
    params: tuple[tuple[str, Any], ...] = (("src", src), ("dst", dst))
    return params if group is None else (*params, ("group", group.ranks))


def _dtype_name(dtype: Any) -> str:
    """A dtype's name (``"float32"``) from a numpy dtype, its name, or a torch dtype."""
    if type(dtype).__module__.startswith("torch"):
        return str(dtype).removeprefix("torch.")
    return interop.numpy_dtype_name(np.dtype(dtype))


# -- choosing and starting a backend ----------------------------------------------------------


def is_available(backend: str) -> bool:
    """Whether ``run(..., backend=backend)`` can work here ("sim" always; "gloo" needs torch,
    "nccl" needs CUDA devices; "auto"/"torch" when gloo or nccl is)."""
    if backend == "sim":
        return True
    if backend in ("auto", "torch"):
        return is_available("gloo") or is_available("nccl")
    if backend not in BACKENDS or importlib.util.find_spec("torch") is None:
        return False
    import torch
    import torch.distributed as torch_dist

    if not torch_dist.is_available():
        return False
    if backend == "gloo":
        return bool(torch_dist.is_gloo_available())
    return bool(torch_dist.is_nccl_available() and torch.cuda.device_count() > 0)


def available_backends() -> list[str]:
    """The backends of ``("sim", "gloo", "nccl")`` that work on this machine."""
    return [name for name in BACKENDS if is_available(name)]


def auto_backend(world_size: int) -> str:
    """ "nccl" with a GPU for every rank, else "gloo"."""
    if is_available("nccl"):
        import torch

        if torch.cuda.device_count() >= world_size:
            return "nccl"
    if is_available("gloo"):
        return "gloo"
    raise RuntimeError(
        "no torch.distributed backend is available here (is torch installed?); use "
        "backend='sim' for the simulated world"
    )


def resolve_backend(backend: str, world_size: int) -> str:
    """The concrete backend for ``run``: "auto"/"torch" is nccl with a GPU per rank, else gloo."""
    if backend in ("auto", "torch"):
        return auto_backend(world_size)
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
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    timeout: float | None = None,
    deterministic: bool = True,
    trace: Any = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` once on each of ``world_size`` ranks; results in rank order.

    ``backend``: "sim" (greenlets in this thread, the default), "gloo" or "nccl" (one process
    per rank, kept alive between calls), "auto" (nccl with one GPU per rank, else gloo).
    ``timeout`` (seconds): on "sim" how long a rank may run its own code without reaching a
    collective (default :data:`chainrule.dist.simulated.DEFAULT_TIMEOUT`), on torch backends
    how long the whole call may take (default :data:`chainrule.dist.pool.DEFAULT_TIMEOUT`).
    ``deterministic`` (sim only): every rank receives the same bits, reduced in rank order;
    False lets each rank sum in its own ring order, so results differ in the last bits.
    ``trace``: a :class:`~chainrule.dist.trace.Trace` that receives one event per collective.

    An exception on a rank is re-raised as :class:`~chainrule.dist.world.RankError`; a
    mismatch, a rank that left early, a timeout or a ``run`` inside a rank as
    :class:`~chainrule.dist.world.CollectiveError`.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int | np.integer):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    refuse_nested_run()
    kwargs = dict(kwargs or {})
    name = resolve_backend(backend, int(world_size))
    if name == "sim":
        from chainrule.dist.simulated import SimulatedWorld

        world = SimulatedWorld(
            int(world_size), timeout=timeout, deterministic=deterministic, trace=trace
        )
        return world.run(fn, args, kwargs)
    from chainrule.dist import pool

    return pool.run(fn, int(world_size), name, args, kwargs, timeout, trace)
