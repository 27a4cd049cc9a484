"""The torch.distributed backends (gloo on CPU, NCCL on GPUs): one process per rank.

Two ways in:

- :func:`run` (``dist.run(fn, P, backend="gloo")``) keeps a pool of P worker processes per
  (backend, P), each of which called ``init_process_group`` once and then waits for work. The
  function and its arguments travel *by value* (cloudpickle), so a function defined in a
  notebook cell or in ``__main__`` runs too. The first call starts the pool. For gloo the
  ranks are forked from the caller when it has already imported torch (tens of milliseconds),
  else one fresh interpreter imports torch (about a second, most of the start-up) and forks the
  other ranks: the import is paid once, not P times. NCCL starts one interpreter per rank.
  Later calls cost a few milliseconds. Interpreters are started with ``python -c`` from this
  importable module, never by re-importing the caller's ``__main__``, and the workers exit when
  the parent process does.
- :func:`init_from_env` under torchrun (one process per rank started by torchrun, on one or
  several machines): afterwards the same SPMD function calls the same collectives.

Inside a rank, :class:`TorchRank` implements the collectives on ``torch.distributed``. Numpy
arrays and :class:`chainrule.Tensor` are converted to torch tensors (on ``cuda:<local rank>``
for NCCL) and back; torch tensors come back on the device they came from. gloo has no
``AVG``: it sums and divides by P. On two CPU ranks, a sum that must not overwrite its input
(``all_reduce(x)``, ``reduce_scatter``) is one exchange and one addition (:func:`pair_sum`):
no copy, and half the traffic for a reduce-scatter. Otherwise, since gloo's reduce-scatter is
about 3× slower than its all-reduce on large arrays, reduce-scatter is an all-reduce followed
by a slice.

torch is imported only when a torch backend is used: the simulated world never needs it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.util
import io
import json
import linecache
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle
import numpy as np

from chainrule.dist import api
from chainrule.dist.api import ReduceOp
from chainrule.dist.errors import CollectiveError, RankError
from chainrule.dist.trace import CollectiveEvent, Trace

DEFAULT_TIMEOUT = 30.0
"""Seconds a whole ``run`` on gloo/nccl may take before its processes are stopped."""

START_TIMEOUT = 120.0
"""Seconds to start a pool of workers (interpreter, ``import torch``, ``init_process_group``)."""

ERROR_GRACE = 1.0
"""After one rank raised, seconds to wait for the others before stopping the pool (they may be
blocked in a collective waiting for the rank that raised)."""

MAX_POOLED_WORKERS = 12
"""Worker processes kept alive over all pools; the least recently used pools close first."""

_MAX_NDIM = 16  # dimensions a broadcast/scatter header can describe


# -- availability -----------------------------------------------------------------------------


def backend_available(name: str) -> bool:
    """Whether torch.distributed backend ``name`` ("gloo" or "nccl") works here."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    import torch.distributed as torch_dist

    if not torch_dist.is_available():
        return False
    if name == "gloo":
        return torch_dist.is_gloo_available()
    if name == "nccl":
        return torch_dist.is_nccl_available() and torch.cuda.device_count() > 0
    return False


def auto_backend(world_size: int) -> str:
    """ "nccl" with a GPU for every rank, else "gloo"."""
    if backend_available("nccl"):
        import torch

        if torch.cuda.device_count() >= world_size:
            return "nccl"
    if backend_available("gloo"):
        return "gloo"
    raise RuntimeError(
        "no torch.distributed backend is available here (is torch installed?); use "
        "backend='sim' for the simulated world"
    )


# -- one rank on torch.distributed ------------------------------------------------------------

_TORCH_DTYPES = (
    "float32 float64 float16 bfloat16 int64 int32 int16 int8 uint8 bool complex64 complex128"
).split()
_KIND_NUMPY, _KIND_TENSOR, _KIND_TORCH = 0, 1, 2


class TorchRank:
    """One rank of a torch.distributed process group: the collectives of this process.

    ``device``: where tensors are sent from (``cpu`` for gloo, ``cuda:<local rank>`` for NCCL).
    ``events``: when a list, every collective appends (op, shape, dtype, nbytes, kwargs).

    ``all_reduce(x, op)`` leaves x alone and writes the result into memory of its own (large
    CPU results from :data:`tensor_pool`): two ranks exchange their tensors and add, otherwise
    x is copied and the copy reduced (:func:`all_reduce_copy`); ``all_reduce(x, op, out=x)``
    reduces x in place.
    """

    def __init__(self, backend: str, device: Any, group: Any = None) -> None:
        import torch
        import torch.distributed as torch_dist

        self._torch = torch
        self._dist = torch_dist
        self.backend = backend
        self.device = torch.device(device)
        self.group = group
        self._rank = torch_dist.get_rank(group)
        self._world_size = torch_dist.get_world_size(group)
        self.events: list[tuple] | None = None
        ops = torch_dist.ReduceOp
        self._ops = {ReduceOp.SUM: ops.SUM, ReduceOp.MAX: ops.MAX, ReduceOp.AVG: ops.AVG}
        self._native_avg = backend == "nccl"
        # gloo's reduce-scatter is about 3× slower than its all-reduce on large arrays
        self.reduce_scatter_via_all_reduce = backend == "gloo"
        # two CPU ranks sum by one exchange and one addition (pair_sum) where they can
        self.pair_sums = True

    def rank(self) -> int:
        return self._rank

    def world_size(self) -> int:
        return self._world_size

    # -- conversions ------------------------------------------------------------------------

    def _to_torch(self, x: Any, fresh: bool) -> tuple[Any, Callable[[Any], Any], int]:
        """``x`` as a contiguous tensor on this rank's device, the way back, and its kind.

        ``fresh``: the tensor must not share memory with ``x`` (it will be written in place).
        """
        torch = self._torch
        if api.is_torch_tensor(x):
            source_device = x.device
            t = x.detach()
            if t.device != self.device:
                t = t.to(self.device)
            elif fresh:
                t = _fresh_copy(t)
            t = t.contiguous()

            def back(out: Any) -> Any:
                return out if out.device == source_device else out.to(source_device)

            return t, back, _KIND_TORCH
        array, restore = api.to_numpy(x)
        kind = _KIND_TENSOR if api.is_chainrule_tensor(x) else _KIND_NUMPY
        if fresh and array.nbytes >= MIN_POOLED_BYTES and self.device.type == "cpu":
            t = tensor_pool.empty(array.shape, _torch_dtype(array.dtype))
            np.copyto(t.numpy(), array, casting="no")
            return t, _numpy_back(restore), kind
        if fresh or not array.flags.writeable or not array.flags.c_contiguous:
            array = np.array(array, order="C", copy=True)
        t = torch.from_numpy(array)
        if t.device != self.device:
            t = t.to(self.device)
        return t, _numpy_back(restore), kind

    def _back_for(self, kind: int) -> Callable[[Any], Any]:
        """The way back for a rank that passed None: the source's kind of value."""
        if kind == _KIND_TORCH:
            return lambda out: out
        return _numpy_back(api._as_chainrule_tensor if kind == _KIND_TENSOR else api._as_array)

    def _record(self, name: str, t: Any, **kwargs: Any) -> None:
        if self.events is not None:
            shape = None if t is None else tuple(t.shape)
            dtype = None if t is None else _dtype_name(t.dtype)
            nbytes = 0 if t is None else t.numel() * t.element_size()
            self.events.append((name, shape, dtype, nbytes, kwargs))

    # -- the collectives --------------------------------------------------------------------

    def all_reduce(self, x: Any, op: ReduceOp, out: Any = None) -> Any:
        """⊕_r x_r as a new value of x's type, or written into ``out`` (which may be x)."""
        if out is not None:
            return self._all_reduce_into(x, op, out)
        source = x.detach() if api.is_torch_tensor(x) else None
        if source is not None and source.device == self.device and source.is_contiguous():
            # Two ranks exchange, a large copy overlaps the all-reduce (all_reduce_copy).
            _check_reducible(source, op)
            self._record("all_reduce", source, op=op)
            result = tensor_pool.empty(source.shape, source.dtype, source.device)
            self._all_reduce_copy(result, source, op)
            return result
        t, back, _ = self._to_torch(x, fresh=True)
        _check_reducible(t, op)
        self._record("all_reduce", t, op=op)
        self._all_reduce_inplace(t, op)
        return back(t)

    def _all_reduce_into(self, x: Any, op: ReduceOp, out: Any) -> Any:
        """Write ⊕_r x_r into ``out`` (x's shape and dtype) and return ``out``."""
        if out is x and api.is_torch_tensor(x) and x.device == self.device:
            if x.is_contiguous():  # in place, like torch.distributed.all_reduce
                t = x.detach() if x.requires_grad else x
                _check_reducible(t, op)
                self._record("all_reduce", t, op=op)
                self._all_reduce_inplace(t, op)
                return out
        target, write_back = self._writable_torch(out)
        source = target if out is x else self._to_torch(x, fresh=False)[0]
        if tuple(source.shape) != tuple(target.shape) or source.dtype != target.dtype:
            raise ValueError(
                f"all_reduce: out has shape {tuple(target.shape)} {_dtype_name(target.dtype)} "
                f"but x has {tuple(source.shape)} {_dtype_name(source.dtype)}; out must be "
                "like x"
            )
        _check_reducible(source, op)
        self._record("all_reduce", source, op=op)
        if source is target:
            self._all_reduce_inplace(target, op)
        else:
            self._all_reduce_copy(target, source, op)
        write_back()
        return out

    def _writable_torch(self, out: Any) -> tuple[Any, Callable[[], None]]:
        """A contiguous tensor on this rank's device to write a result into, and the step that
        copies it into ``out`` (nothing to do when the tensor is ``out``'s own memory)."""
        if api.is_torch_tensor(out):
            target = out.detach()
        elif isinstance(out, np.ndarray) or api.is_chainrule_tensor(out):
            array = out.data if api.is_chainrule_tensor(out) else out
            if not array.flags.writeable:
                raise ValueError("all_reduce: out is a read-only array")
            if array.dtype.kind not in "biufc":
                raise TypeError(f"all_reduce: out must hold numbers, not {array.dtype}")
            target = self._torch.from_numpy(array) if array.flags.c_contiguous else None
            if target is None or target.device != self.device:
                staged = self._torch.from_numpy(np.ascontiguousarray(array)).to(self.device)
                return staged, lambda: np.copyto(array, api.torch_to_numpy(staged))
            return target, _nothing
        else:
            raise TypeError(
                f"all_reduce: out must be a numpy array, a chainrule Tensor or a torch tensor, "
                f"not {type(out).__name__}"
            )
        if target.device == self.device and target.is_contiguous():
            return target, _nothing
        staged = target.to(self.device, memory_format=self._torch.contiguous_format, copy=True)
        return staged, lambda: target.copy_(staged)

    def _all_reduce_inplace(self, t: Any, op: ReduceOp) -> None:
        if op is ReduceOp.AVG and not self._native_avg:
            self._dist.all_reduce(t, op=self._ops[ReduceOp.SUM], group=self.group)
            t.div_(self._world_size)
        else:
            self._dist.all_reduce(t, op=self._ops[op], group=self.group)

    def _all_reduce_copy(self, out: Any, x: Any, op: ReduceOp) -> None:
        """out ← ⊕_r x_r for a contiguous ``out`` (see :func:`all_reduce_copy`)."""
        native = op is not ReduceOp.AVG or self._native_avg
        reduce_op = self._ops[op if native else ReduceOp.SUM]
        all_reduce_copy(self._dist, out, x, reduce_op, self.group, pair=self.pair_sums)
        if not native:
            out.div_(self._world_size)

    def all_gather(self, x: Any, axis: int) -> Any:
        t, back, _ = self._to_torch(x, fresh=False)
        if t.ndim == 0:
            t = t.reshape(1)
        axis = api.normalize_axis(axis, t.ndim, "axis")
        self._record("all_gather", t, axis=axis)
        P = self._world_size
        # concatenated along dim 0
        gathered = tensor_pool.empty((P * t.shape[0], *t.shape[1:]), t.dtype, t.device)
        _all_gather_single(self._dist, gathered, t, self.group)
        stacked = gathered.view(P, *t.shape)
        shape = list(t.shape)
        shape[axis] *= P
        return back(stacked.movedim(0, axis).reshape(shape))

    def reduce_scatter(self, x: Any, op: ReduceOp, axis: int) -> Any:
        P = self._world_size
        t, back, _ = self._to_torch(x, fresh=False)
        _check_reducible(t, op)
        axis = api.check_divisible(t, axis, P, "reduce_scatter")
        self._record("reduce_scatter", t, op=op, axis=axis)
        native = op is not ReduceOp.AVG or self._native_avg
        reduce_op = self._ops[op if native else ReduceOp.SUM]
        peer = pair_peer(self._dist, t, reduce_op, self.group) if self.pair_sums else None
        if peer is not None:  # one exchange of halves and one addition
            halves = [half.contiguous() for half in t.chunk(P, dim=axis)]
            mine = halves[self._rank]
            out = tensor_pool.empty(mine.shape, mine.dtype, mine.device)
            pair_sum(self._dist, out, halves[1 - self._rank], mine, peer, self.group)
            return back(out if native else out.div_(P))
        via_all_reduce = self.reduce_scatter_via_all_reduce
        if via_all_reduce:
            t = _fresh_copy(t)
            self._all_reduce_inplace(t, op)
            mine = t.chunk(P, dim=axis)[self._rank]
            return back(mine.clone(memory_format=self._torch.contiguous_format))
        moved = t.movedim(axis, 0).contiguous()
        out = tensor_pool.empty((moved.shape[0] // P, *moved.shape[1:]), moved.dtype, moved.device)
        _reduce_scatter_single(self._dist, out, moved, reduce_op, self.group)
        if not native:
            out.div_(P)
        return back(out.movedim(0, axis).contiguous())

    def all_to_all(self, x: Any, split_axis: int, concat_axis: int) -> Any:
        t, back, _ = self._to_torch(x, fresh=False)
        P = self._world_size
        split_axis = api.check_divisible(t, split_axis, P, "all_to_all", "split_axis")
        concat_axis = api.normalize_axis(concat_axis, t.ndim, "concat_axis")
        self._record("all_to_all", t, split_axis=split_axis, concat_axis=concat_axis)
        moved = t.movedim(split_axis, 0).contiguous()  # chunk j = rows j·c ... (j+1)·c − 1
        received = tensor_pool.empty(moved.shape, moved.dtype, moved.device)
        self._dist.all_to_all_single(received, moved, group=self.group)
        chunk = moved.shape[0] // P
        # received[j·c + i] is row i of rank j's chunk for this rank, split axis first.
        blocks = received.reshape(P, chunk, *moved.shape[1:]).movedim(1, split_axis + 1)
        shape = list(blocks.shape[1:])
        shape[concat_axis] *= P
        return back(blocks.movedim(0, concat_axis).reshape(shape).contiguous())

    def _header(self, t: Any, src: int, kind: int) -> tuple[list[int], Any, int]:
        """Broadcast (shape, dtype, kind of value) of ``t`` from ``src`` to every rank.

        A rank that passed None learns what to allocate and what type to return.
        """
        torch = self._torch
        header = torch.zeros(4 + _MAX_NDIM, dtype=torch.int64)
        if self._rank == src:
            if t.ndim > _MAX_NDIM:
                raise ValueError(f"at most {_MAX_NDIM} dimensions, got {t.ndim}")
            header[:4] = torch.tensor([kind, _TORCH_DTYPES.index(_dtype_name(t.dtype)), t.ndim, 0])
            header[4 : 4 + t.ndim] = torch.tensor(t.shape)
        header = header.to(self.device)
        self._dist.broadcast(header, src=src, group=self.group)
        values = header.tolist()
        ndim = values[2]
        dtype = getattr(torch, _TORCH_DTYPES[values[1]])
        return values[4 : 4 + ndim], dtype, values[0]

    def broadcast(self, x: Any, src: int) -> Any:
        src = api.check_src(src, self._world_size)
        is_src = self._rank == src
        if x is None and is_src:
            raise ValueError(f"broadcast: the source rank {src} must pass an array, not None")
        t, back, kind = (None, None, 0) if x is None else self._to_torch(x, fresh=False)
        shape, dtype, src_kind = self._header(t, src, kind)
        if is_src:
            out = t.clone()
        else:
            out = self._torch.empty(shape, dtype=dtype, device=self.device)
        self._record("broadcast", t, src=src)
        self._dist.broadcast(out, src=src, group=self.group)
        if t is not None and not is_src and (list(t.shape) != shape or t.dtype != dtype):
            raise CollectiveError(
                f"broadcast: rank {self._rank} passed shape {tuple(t.shape)} "
                f"{_dtype_name(t.dtype)} but the source rank {src} sends {tuple(shape)} "
                f"{_dtype_name(dtype)}; pass None or an array like the source's"
            )
        return (back if back is not None else self._back_for(src_kind))(out)

    def scatter(self, x: Any, src: int, axis: int) -> Any:
        P = self._world_size
        src = api.check_src(src, P)
        is_src = self._rank == src
        if x is None and is_src:
            raise ValueError(f"scatter: the source rank {src} must pass an array, not None")
        t, back, kind = (None, None, 0) if x is None else self._to_torch(x, fresh=False)
        chunks = None
        if is_src:
            axis = api.check_divisible(t, axis, P, "scatter")
            chunks = [c.contiguous() for c in t.chunk(P, dim=axis)]
        shape, dtype, src_kind = self._header(chunks[0] if is_src else None, src, kind)
        out = self._torch.empty(shape, dtype=dtype, device=self.device)
        kwargs = {"src": src, "axis": axis} if is_src else {"src": src}
        self._record("scatter", t, **kwargs)
        self._dist.scatter(out, chunks, src=src, group=self.group)
        return (back if back is not None else self._back_for(src_kind))(out)

    def barrier(self) -> None:
        self._record("barrier", None)
        if self.backend == "nccl":
            self._dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            self._dist.barrier(group=self.group)


def _numpy_back(restore: api.Restore) -> Callable[[Any], Any]:
    def back(out: Any) -> Any:
        return restore(api.torch_to_numpy(out))

    return back


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _check_reducible(t: Any, op: ReduceOp) -> None:
    if t.dtype.is_complex:
        kind = "c"
    elif t.dtype.is_floating_point:
        kind = "f"
    else:
        kind = "b" if _dtype_name(t.dtype) == "bool" else "i"
    api.check_reducible_kind(kind, _dtype_name(t.dtype), op)


def _all_gather_single(torch_dist: Any, out: Any, t: Any, group: Any) -> None:
    gather = getattr(torch_dist, "all_gather_single", None)
    if gather is None:  # torch before the rename
        gather = torch_dist.all_gather_into_tensor
    gather(out, t, group=group)


def _reduce_scatter_single(torch_dist: Any, out: Any, t: Any, op: Any, group: Any) -> None:
    scatter = getattr(torch_dist, "reduce_scatter_single", None)
    if scatter is None:  # torch before the rename
        scatter = torch_dist.reduce_scatter_tensor
    scatter(out, t, op=op, group=group)


def _nothing() -> None:
    pass


def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    return torch.from_numpy(np.empty(0, dtype)).dtype


# -- reusing result memory, and copies that overlap the all-reduce -----------------------------

MIN_POOLED_BYTES = 1 << 20
"""Smaller results come from the ordinary allocator (which already reuses small blocks)."""

OVERLAP_MIN_BYTES = 8 << 20
"""From this size on a copy-then-all-reduce runs in two chunks (a quarter, then the rest): the
all-reduce of the first chunk runs (``async_op=True``) while the rest is copied."""


class TensorPool:
    """Large CPU tensors whose memory is handed out again once nothing refers to it any more.

    A collective must give each caller a tensor of its own, but writing freshly allocated 64 MB
    costs about 3× a copy into memory already mapped (every page faults on first touch: above
    glibc's mmap threshold each allocation maps new pages). The pool keeps one tensor per
    buffer and hands out another tensor on the same memory (``detach()``: no autograd history,
    no view relation). The memory goes out again only when nothing but the pool refers to it:
    the storage's use count (one per tensor, view, numpy array or DLPack capsule on it) and the
    reference count of its Python storage object are back to those of an unused tensor. This
    is the test torch's own gradient accumulation uses to steal a gradient
    (``use_count() == 1``), applied to the storage. Without the private counters (another
    torch) nothing is reused. ``max_bytes`` bounds the memory kept; :meth:`clear` lets it go.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._kept: dict[tuple, list[Any]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def empty(self, shape: Any, dtype: Any, device: Any = "cpu") -> Any:
        """An uninitialised contiguous tensor that no one else uses."""
        import torch

        shape = tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_POOLED_BYTES or torch.device(device).type != "cpu" or not _unused_known():
            return torch.empty(shape, dtype=dtype, device=device)
        key = (shape, dtype)
        with self._lock:
            kept = self._kept.setdefault(key, [])
            for owner in kept:
                if storage_unshared(owner):
                    return owner.detach()
            owner = torch.empty(shape, dtype=dtype)
            if self._bytes + nbytes <= self.max_bytes:
                kept.append(owner)
                self._bytes += nbytes
            return owner.detach()

    def clear(self) -> None:
        """Forget every kept tensor (those in use stay valid: they are ordinary tensors)."""
        with self._lock:
            self._kept.clear()
            self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes


tensor_pool = TensorPool()
"""The pool of this process: results of the wrapper's and of the autograd all-reduces."""


_unused_counts: tuple[int, int] | None = None


def _storage_counts(t: Any) -> tuple[int, int]:
    """(C++ use count of t's storage, references to its Python storage object)."""
    import torch

    storage = t.untyped_storage()
    return torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(storage)


def _unused_known() -> bool:
    """Whether the counts of an unused storage are known (measured once on a fresh tensor)."""
    global _unused_counts
    if _unused_counts is None:
        import torch

        try:
            _unused_counts = _storage_counts(torch.empty(1))
        except (AttributeError, TypeError, RuntimeError):
            _unused_counts = (-1, -1)
    return _unused_counts[0] >= 0


def storage_unshared(t: Any) -> bool:
    """Whether only ``t`` refers to its memory: no other tensor, view, numpy array, DLPack
    capsule or Python storage object (False where torch lacks the counters)."""
    return _unused_known() and _storage_counts(t) == _unused_counts


def _fresh_copy(t: Any) -> Any:
    """A contiguous copy of ``t`` in memory no one else uses (pooled when large, on CPU)."""
    import torch

    if t.numel() * t.element_size() < MIN_POOLED_BYTES:
        return t.clone(memory_format=torch.contiguous_format)
    out = tensor_pool.empty(t.shape, t.dtype, t.device)
    out.copy_(t)
    return out


PAIR_TAG = 0x6372
"""The message tag of the two-rank exchange (:func:`all_reduce_copy`), apart from the default
tag 0 that an SPMD function's own ``send``/``recv`` use."""

EXACT_PAIR_SUM_DTYPES = frozenset(
    {"float32", "float64", "int8", "int16", "int32", "int64", "uint8"}
)
"""Dtypes whose sum of two elements is one correctly rounded (or exact) addition in torch and
in gloo alike, so that the exchange gives gloo's bits."""


def all_reduce_copy(
    torch_dist: Any, out: Any, x: Any, op: Any, group: Any = None, pair: bool = True
) -> None:
    """out ← ⊕_r x_r (torch.distributed ``op``) for a contiguous ``out`` of x's shape and dtype.

    ``x`` is left as it was. Three ways, fastest first (``pair=False`` skips the first):

    - Two ranks on CPU, a sum (:func:`pair_peer`): each rank sends its ``x`` to the other and
      receives the other's into ``out``, then adds its own: ``out = x_0 + x_1``. That is the
      all-reduce without the copy, moving as many bytes as gloo's ring for P = 2 (n each way
      per rank). One addition of two numbers is correctly rounded whatever the order, so the
      bits are gloo's, NaN payloads aside: the sum of two NaNs carries the first one's, so
      both ranks add in the same order and agree bit for bit.
    - A large contiguous CPU tensor: the copy runs in two chunks, a quarter then the rest, and
      the all-reduce of the first chunk (``async_op=True``) overlaps the copy of the rest:
      each element is still reduced exactly once, in the same way.
    - Otherwise: copy, then all-reduce in place.

    The collectives get an alias of ``out`` (``detach()``: same memory, another tensor), never
    ``out`` or a view of it: gloo's worker thread drops its reference to a finished collective's
    tensors a moment after ``wait()`` returns, and until then ``out`` would look shared to
    autograd, which then copies a gradient instead of taking it.
    """
    nbytes = out.numel() * out.element_size()
    alias = out.detach()
    shared = _shares_memory(out, x)
    exchange = pair and not shared and x.is_contiguous()
    peer = pair_peer(torch_dist, x, op, group) if exchange else None
    if peer is not None:
        pair_sum(torch_dist, out, x, x, peer, group)
        return
    if nbytes < OVERLAP_MIN_BYTES or out.device.type != "cpu" or not x.is_contiguous():
        alias.copy_(x)  # raises if the two overlap only in part
        torch_dist.all_reduce(alias, op=op, group=group)
        return
    if shared:
        if out.data_ptr() == x.data_ptr() and out.stride() == x.stride():
            torch_dist.all_reduce(alias, op=op, group=group)  # the same elements: in place
            return
        x = x.clone()  # overlapping elsewhere: copying in chunks would read what it wrote
    flat_out, flat_x = alias.view(-1), x.view(-1)
    first = flat_out.numel() // 4
    flat_out[:first].copy_(flat_x[:first])
    work = torch_dist.all_reduce(flat_out[:first], op=op, group=group, async_op=True)
    flat_out[first:].copy_(flat_x[first:])
    rest = torch_dist.all_reduce(flat_out[first:], op=op, group=group, async_op=True)
    work.wait()
    rest.wait()


def pair_peer(torch_dist: Any, x: Any, op: Any, group: Any = None) -> int | None:
    """The other rank's global rank when reducing ``x`` can be one exchange and one addition
    (:func:`pair_sum`): a group of two, a CPU tensor, a sum, a dtype of
    :data:`EXACT_PAIR_SUM_DTYPES`; else None."""
    if (
        x.device.type != "cpu"
        or op != torch_dist.ReduceOp.SUM
        or _dtype_name(x.dtype) not in EXACT_PAIR_SUM_DTYPES
        or torch_dist.get_world_size(group) != 2
    ):
        return None
    other = 1 - torch_dist.get_rank(group)
    return other if group is None else torch_dist.get_global_rank(group, other)


def pair_sum(torch_dist: Any, out: Any, send: Any, mine: Any, peer: int, group: Any = None) -> None:
    """out ← mine_0 + mine_1 on two ranks, where rank r's ``mine`` is its own term and its
    ``send`` the term the other rank needs: each rank sends ``send`` to ``peer`` and receives
    the peer's into ``out``, then adds ``mine``, rank 0's term first on both ranks (the sum of
    two NaNs carries the first one's payload). All-reduce: ``send`` and ``mine`` are both x;
    reduce-scatter: the other rank's half of x and this rank's half.

    ``send`` and ``mine`` contiguous CPU tensors, ``out`` like ``mine`` in memory of its own.
    """
    import torch

    alias = out.detach()  # see all_reduce_copy
    sending = torch_dist.isend(send.detach(), peer, group=group, tag=PAIR_TAG)
    torch_dist.recv(alias, peer, group=group, tag=PAIR_TAG)
    sending.wait()
    if torch_dist.get_rank(group) == 0:  # alias holds rank 1's term
        torch.add(mine, alias, out=alias)
    else:  # alias holds rank 0's term
        alias.add_(mine)


def _shares_memory(a: Any, b: Any) -> bool:
    """Whether tensors ``a`` and ``b`` lie in one storage."""
    if a.device != b.device:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


_default_group_rank: TorchRank | None = None


def default_group_backend() -> TorchRank:
    """A :class:`TorchRank` on a default process group that someone else initialised."""
    global _default_group_rank
    import torch
    import torch.distributed as torch_dist

    if _default_group_rank is None or _default_group_rank.rank() != torch_dist.get_rank():
        backend = str(torch_dist.get_backend())
        if backend == "nccl":
            device: Any = torch.device("cuda", torch.cuda.current_device())
        else:
            device = "cpu"
        _default_group_rank = TorchRank(backend, device)
    return _default_group_rank


# -- torchrun ---------------------------------------------------------------------------------

_initialised_here = False


def init_from_env(backend: str = "auto") -> TorchRank:
    """Join the process group described by torchrun's environment; returns this rank.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``. ``backend="auto"`` is NCCL when this machine has a GPU for each of its
    local ranks, else gloo. With NCCL, rank tensors live on ``cuda:<LOCAL_RANK>``. Afterwards
    :func:`chainrule.dist.rank` and the collectives use this process group.
    """
    global _initialised_here
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [v for v in needed if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_from_env() needs the environment torchrun sets ({', '.join(missing)} "
            "missing): start the script with `torchrun --nproc-per-node=2 script.py`, or run "
            "the SPMD function with dist.run(fn, world_size)"
        )
    import torch
    import torch.distributed as torch_dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if backend in ("auto", "torch"):
        nccl = backend_available("nccl") and torch.cuda.device_count() >= local_world
        backend = "nccl" if nccl else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device: Any = torch.device("cuda", local_rank)
    else:
        device = "cpu"
    if not torch_dist.is_initialized():
        if backend == "nccl":
            torch_dist.init_process_group(backend, device_id=device)
        else:
            torch_dist.init_process_group(backend)
        _initialised_here = True
    rank = TorchRank(backend, device)
    api.set_process_backend(rank)
    return rank


# -- the worker processes ---------------------------------------------------------------------


def worker_main() -> None:
    """Entry point of a pool's worker process (``python -c``): arguments in ``sys.argv``.

    ``sys.argv[1:]``: the world size, the backend, the rendezvous port, the pid of the process
    that started the pool, then ``rank:task_fd:reply_fd`` for each rank this process hosts. A
    process that hosts several ranks (gloo) imports torch once and forks one process per further
    rank: ``import torch`` is most of a rank's start-up, and forked ranks share its pages.
    """
    world_size, backend, port, parent = (
        int(sys.argv[1]),
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    hosted = [_RankPipes(*map(int, spec.split(":"))) for spec in sys.argv[5:]]
    # Ctrl-C and interrupting a notebook kernel are for the parent, which stops the pool if a
    # run was interrupted (the workers have a session of their own; this is for kill -INT).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import torch  # noqa: F401 - before the fork, so that every rank shares the import
        import torch.distributed  # noqa: F401
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        for pipes in hosted:
            Connection(pipes.reply_fd, readable=False).send_bytes(
                cloudpickle.dumps(("failed", pipes.rank, _describe(exc)))
            )
        return
    forked = []
    for pipes in hosted[1:]:
        pid = os.fork()
        if pid == 0:  # the new rank: keep its own pipes only, serve, and never return
            try:
                _close_pipes_except(hosted, pipes)
                _serve(pipes, world_size, backend, port, watch=os.getppid())
            finally:
                os._exit(0)
        forked.append(pid)
    _close_pipes_except(hosted, hosted[0])
    try:
        _serve(hosted[0], world_size, backend, port, watch=parent)
    finally:
        for pid in forked:
            os.waitpid(pid, 0)
    # Skip the interpreter's teardown (tenths of a second with torch loaded): the parent
    # waits for this exit when it closes the pool.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _RankPipes:
    """The two pipe ends of one rank's worker: tasks in, replies out."""

    def __init__(self, rank: int, task_fd: int, reply_fd: int) -> None:
        self.rank, self.task_fd, self.reply_fd = rank, task_fd, reply_fd


def _close_pipes_except(hosted: list[_RankPipes], keep: _RankPipes) -> None:
    """Close the other ranks' pipe ends: a rank that dies must close its last reply writer."""
    for pipes in hosted:
        if pipes is not keep:
            os.close(pipes.task_fd)
            os.close(pipes.reply_fd)


def _serve(pipes: _RankPipes, world_size: int, backend: str, port: int, watch: int) -> None:
    """Join the process group as ``pipes.rank``, then run tasks until told to stop.

    ``watch``: the process whose end ends this one too (the pool's owner, or the process that
    forked this rank).
    """
    import torch
    import torch.distributed as torch_dist

    rank = pipes.rank
    tasks = Connection(pipes.task_fd, writable=False)
    replies = Connection(pipes.reply_fd, readable=False)
    threading.Thread(target=_exit_with_parent, args=(watch,), daemon=True).start()
    try:
        torch.set_num_threads(1)  # P processes share the machine's cores
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device: Any = torch.device("cuda", rank)
        else:
            device = "cpu"
        torch_dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            **({"device_id": device} if backend == "nccl" else {}),
        )
        me = TorchRank(backend, device)
        api.set_process_backend(me)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        replies.send_bytes(cloudpickle.dumps(("failed", rank, _describe(exc))))
        return
    replies.send_bytes(cloudpickle.dumps(("ready", rank, os.getpid())))
    while True:
        try:
            message = tasks.recv_bytes()
        except (EOFError, OSError):
            break
        reply = _run_task(message, rank, me)
        if reply is None:
            break
        replies.send_bytes(reply)
    torch_dist.destroy_process_group()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _describe(exc: BaseException) -> tuple[str, str, str]:
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return type(exc).__name__, str(exc), text


def _run_task(message: bytes, rank: int, me: TorchRank) -> bytes | None:
    """Run one task; the pickled reply (None for the stop message).

    A reply is (status, rank, result or error, trace events, printed output): what the
    function prints goes back to the caller, which shows it (in a notebook, under the cell).
    """
    events: list[tuple] = []
    output = io.StringIO()
    try:
        task = cloudpickle.loads(message)
        if task[0] == "stop":
            return None
        _, path, fn, args, kwargs, tracing = task
        sys.path[:0] = [p for p in path if p not in sys.path]
        me.events = events if tracing else None
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            result = fn(*args, **kwargs)
        reply: tuple = ("ok", rank, _to_cpu(result), events, output.getvalue())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        reply = ("error", rank, _describe(exc), events, output.getvalue())
    finally:
        me.events = None
        tensor_pool.clear()  # a live worker keeps no result memory between runs
    try:
        return cloudpickle.dumps(reply)
    except Exception as exc:  # the result could not be pickled
        return cloudpickle.dumps(("error", rank, _describe(exc), events, output.getvalue()))


def _to_cpu(value: Any) -> Any:
    """Torch tensors anywhere in lists, tuples and dicts moved to the CPU (to be pickled)."""
    if api.is_torch_tensor(value):
        return value.detach().cpu()
    if isinstance(value, list | tuple):
        converted = [_to_cpu(v) for v in value]
        return type(value)(converted) if not hasattr(value, "_fields") else type(value)(*converted)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_BOOTSTRAP = (  # a worker's program: the parent's import path, then worker_main()
    "import json, os, sys\n"
    "path = json.loads(os.environ['CHAINRULE_SYS_PATH'])\n"
    "sys.path[:0] = [p for p in path if p not in sys.path]\n"
    "from chainrule.dist.torch_backend import worker_main\n"
    "worker_main()\n"
)


FORKED_BACKENDS = frozenset({"gloo"})
"""Backends whose ranks share one ``import torch`` by forking: from the caller when it has
already imported torch (a notebook that uses torch), else from one fresh interpreter that imports
it. NCCL keeps one freshly started interpreter per rank, so that each initialises CUDA on its
own."""


def _can_fork_caller() -> bool:
    """Whether ranks may be forked from this process: torch imported, CUDA not initialised."""
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and hasattr(os, "fork")
        and not (hasattr(torch, "cuda") and torch.cuda.is_initialized())
    )


class _ForkedChild:
    """A rank forked from this process, with the ``poll/wait/kill`` of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


class _Pool:
    """P worker processes of one backend, each a rank of one live process group.

    ``procs``: the processes this one started, each hosting the ranks in ``hosts`` (P forked
    ranks, or one fresh interpreter that forks the others, for gloo; one interpreter per rank
    for NCCL); ``pids``: the process of each rank.
    """

    def __init__(self, backend: str, world_size: int) -> None:
        self.backend = backend
        self.world_size = world_size
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen | _ForkedChild] = []
        self.hosts: list[list[int]] = []  # the ranks of each started process, its own first
        self.pids: list[int] = [0] * world_size
        self.tasks: list[Connection] = []
        self.replies: list[Connection] = []
        port = _free_port()
        ranks = list(range(world_size))
        if backend not in FORKED_BACKENDS:
            hosts = [[r] for r in ranks]
        else:
            hosts = [[r] for r in ranks] if _can_fork_caller() else [ranks]
        fork_here = backend in FORKED_BACKENDS and len(hosts) == world_size
        try:
            ends = []  # the worker's ends of each rank's pipes
            for _ in ranks:
                task_read, task_write = os.pipe()
                reply_read, reply_write = os.pipe()
                ends.append(_RankPipes(len(ends), task_read, reply_write))
                self.tasks.append(Connection(task_write, readable=False))
                self.replies.append(Connection(reply_read, writable=False))
            for hosted in hosts:
                if fork_here:
                    proc: subprocess.Popen | _ForkedChild = self._fork(ends, hosted[0], port)
                else:
                    proc = self._start_interpreter([ends[r] for r in hosted], port)
                for r in hosted:
                    os.close(ends[r].task_fd)
                    os.close(ends[r].reply_fd)
                self.procs.append(proc)
                self.hosts.append(hosted)
                self.pids[hosted[0]] = proc.pid
            self._await_ready()
        except BaseException:
            self.close(graceful=False)
            raise

    def _start_interpreter(self, hosted: list[_RankPipes], port: int) -> subprocess.Popen:
        """A fresh ``python -c`` worker for the ranks ``hosted`` (see :func:`worker_main`)."""
        env = dict(os.environ)
        env["CHAINRULE_SYS_PATH"] = json.dumps([p for p in sys.path if isinstance(p, str)])
        env.setdefault("OMP_NUM_THREADS", "1")
        specs = [f"{p.rank}:{p.task_fd}:{p.reply_fd}" for p in hosted]
        return subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(self.world_size), self.backend, str(port)]
            + [str(os.getpid()), *specs],
            pass_fds=[fd for p in hosted for fd in (p.task_fd, p.reply_fd)],
            env=env,
            stdin=subprocess.DEVNULL,
            # A process group of their own: a notebook kernel that shuts down signals the
            # children in its group and polls until they are gone (seconds); this module's
            # exit handler stops the pool instead, in milliseconds.
            start_new_session=True,
        )

    def _fork(self, ends: list[_RankPipes], rank: int, port: int) -> _ForkedChild:
        """Rank ``rank`` as a child forked from this process (which has imported torch)."""
        parent = os.getpid()
        pid = os.fork()
        if pid:
            return _ForkedChild(pid)
        try:  # the child: only this thread exists here; it never returns into the caller
            os.setsid()  # out of a notebook kernel's process group, as _start_interpreter
            gc.freeze()  # the caller's objects stay as they are: no finalizer of theirs runs here
            # A notebook's output streams talk to threads that do not exist in this process.
            sys.stdout = sys.__stdout__ or open(os.devnull, "w")  # noqa: SIM115
            sys.stderr = sys.__stderr__ or open(os.devnull, "w")  # noqa: SIM115
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for conn in self.tasks + self.replies:
                os.close(conn.fileno())
            for later in ends[rank + 1 :]:  # the parent closed the earlier ranks' ends already
                os.close(later.task_fd)
                os.close(later.reply_fd)
            _serve(ends[rank], self.world_size, self.backend, port, watch=parent)
        finally:
            os._exit(0)

    def _await_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        pending = set(range(self.world_size))
        while pending:
            ready = wait([self.replies[r] for r in pending], deadline - time.monotonic())
            if not ready:
                raise CollectiveError(
                    f"starting {self.world_size} {self.backend} workers timed out after "
                    f"{START_TIMEOUT:g} s ({_ranks_text(sorted(pending))} never became ready)"
                )
            for conn in ready:
                r = self.replies.index(conn)
                pending.discard(r)
                try:
                    reply = cloudpickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    raise CollectiveError(
                        f"the {self.backend} worker of rank {r} exited while starting"
                        f"{self.exit_code_text(r)}; see its output above"
                    ) from None
                if reply[0] == "failed":
                    name, message, text = reply[2]
                    raise RankError(r, name, f"while starting {self.backend}: {message}", text)
                self.pids[r] = reply[2]

    def exit_code_text(self, rank: int) -> str:
        """`` (exit code N)`` when ``rank`` had a process of its own that has ended, else ""."""
        for proc, hosted in zip(self.procs, self.hosts, strict=True):
            if hosted[0] == rank:
                try:
                    return f" (exit code {proc.wait(1.0)})"
                except subprocess.TimeoutExpired:
                    return ""
        return ""

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def close(self, graceful: bool = True) -> None:
        """Stop the workers (asking first when ``graceful``), and reap them."""
        if graceful:
            stop = cloudpickle.dumps(("stop",))
            for conn in self.tasks:
                try:
                    conn.send_bytes(stop)
                except OSError:
                    pass
            deadline = time.monotonic() + 2.0
            for proc in self.procs:
                try:
                    proc.wait(max(0.01, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for proc, hosted in zip(self.procs, self.hosts, strict=True):
            if proc.poll() is None:
                # While the process that forked them lives, the forked ranks' pids are theirs
                # (alive or not yet reaped): safe to signal. Afterwards they end by themselves.
                for r in hosted[1:]:
                    if self.pids[r]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(self.pids[r], signal.SIGKILL)
                proc.kill()
        for proc in self.procs:
            proc.wait()
        for conn in self.tasks + self.replies:
            conn.close()
        self.procs, self.hosts, self.tasks, self.replies = [], [], [], []


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


_pools: dict[tuple[str, int], _Pool] = {}  # in order of use, the most recent last
_pools_lock = threading.Lock()


def _pool(backend: str, world_size: int) -> _Pool:
    key = (backend, world_size)
    with _pools_lock:
        pool = _pools.pop(key, None)
        if pool is not None and not pool.alive():
            pool.close(graceful=False)
            pool = None
        while _pools and sum(p.world_size for p in _pools.values()) + world_size > max(
            MAX_POOLED_WORKERS, world_size
        ):
            oldest = next(iter(_pools))
            _pools.pop(oldest).close()
        if pool is None:
            pool = _Pool(backend, world_size)
        _pools[key] = pool
        return pool


def _discard(pool: _Pool) -> None:
    with _pools_lock:
        key = (pool.backend, pool.world_size)
        if _pools.get(key) is pool:
            del _pools[key]
    pool.close(graceful=False)


def shutdown() -> None:
    """Stop every worker pool (and leave a process group this process joined by
    :func:`init_from_env`). Registered to run at exit; safe to call any time."""
    global _initialised_here
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
    if _initialised_here:
        import torch.distributed as torch_dist

        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
        _initialised_here = False
        api.set_process_backend(None)


atexit.register(shutdown)


def run(
    fn: Callable[..., Any],
    world_size: int,
    backend: str,
    args: tuple,
    kwargs: dict[str, Any],
    timeout: float | None,
    trace: Trace | None,
) -> list:
    """``fn(*args, **kwargs)`` on every rank of a pool; see :func:`chainrule.dist.run`."""
    if backend == "nccl":
        import torch

        if torch.cuda.device_count() < world_size:
            raise RuntimeError(
                f"nccl needs one GPU per rank: world_size={world_size} but this machine has "
                f"{torch.cuda.device_count()}"
            )
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    task = cloudpickle.dumps(("run", list(sys.path), fn, args, kwargs, trace is not None))
    pool = _pool(backend, world_size)
    with pool.lock:
        try:
            replies = _dispatch(pool, task, timeout)
        except BaseException:  # e.g. KeyboardInterrupt: the workers are still busy
            _discard(pool)
            raise
    for r in sorted(replies):
        if replies[r][4]:
            sys.stdout.write(replies[r][4])
    errors = {r: reply[2] for r, reply in replies.items() if reply[0] == "error"}
    if errors:
        first = min(errors)
        name, message, text = errors[first]
        error = RankError(first, name, message, _restore_source_lines(text, fn))
        if len(errors) > 1:
            error.add_note(f"{_ranks_text(sorted(set(errors) - {first}))} also raised")
        stuck = sorted(r for r, reply in replies.items() if reply[0] == "stuck")
        if stuck:
            error.add_note(
                f"{_ranks_text(stuck)} did not finish (probably waiting in a collective for "
                f"rank {first}); the {backend} worker processes were stopped and restart on "
                "the next call"
            )
        raise error
    if trace is not None:
        trace.extend(_merge_events([replies[r][3] for r in range(world_size)], backend))
    return [replies[r][2] for r in range(world_size)]


def _dispatch(pool: _Pool, task: bytes, timeout: float) -> dict[int, tuple]:
    """Send ``task`` to every worker; their replies by rank (or stop the pool and raise)."""
    P = pool.world_size
    try:
        for conn in pool.tasks:
            conn.send_bytes(task)
    except OSError:
        _discard(pool)
        raise CollectiveError(f"the {pool.backend} workers stopped unexpectedly") from None
    replies: dict[int, tuple] = {}
    died: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    pending = set(range(P))
    while pending:
        now = time.monotonic()
        if any(reply[0] == "error" for reply in replies.values()) or died:
            deadline = min(deadline, now + ERROR_GRACE)
        ready = wait([pool.replies[r] for r in pending], max(0.0, deadline - now))
        if not ready:
            break
        for conn in ready:
            r = pool.replies.index(conn)
            pending.discard(r)
            try:
                replies[r] = cloudpickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                died[r] = pool.exit_code_text(r)
            except Exception as exc:  # a result that cannot be unpickled here
                replies[r] = ("error", r, _describe(exc), [], "")
    if not pending and not died:
        return replies
    _discard(pool)
    stuck = sorted(pending)
    if died:
        dead = ", ".join(f"rank {r}{code}" for r, code in sorted(died.items()))
        raise CollectiveError(
            f"the {pool.backend} worker process of {dead} died during the run; the pool was "
            "stopped and restarts on the next call"
        )
    if any(reply[0] == "error" for reply in replies.values()):
        return {**replies, **{r: ("stuck", r, None, [], "") for r in stuck}}
    done = sorted(replies)
    raise CollectiveError(
        f"the {pool.backend} run timed out after {timeout:g} s: {_ranks_text(stuck)} did not "
        f"finish" + (f" ({_ranks_text(done)} did)" if done else "") + "; they may be waiting "
        "in a collective that another rank never called. The worker processes were stopped "
        "and restart on the next call; pass timeout= to dist.run to allow longer"
    )


_DYNAMIC_FRAME = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (\S+)$')


def _restore_source_lines(text: str, fn: Callable[..., Any]) -> str:
    """Put file names and source lines back into a worker's traceback.

    cloudpickle sends functions from ``__main__`` (a notebook cell) by value and renames
    their file ``<dynamic-code>``, so the worker's traceback has no source. Here the caller
    still has the original code objects: ``fn``'s, those nested in it, and those of the
    functions it can reach in its module's globals.
    """
    if "<dynamic-code>" not in text:
        return text
    files: dict[str, set[str]] = {}

    def collect(code: Any) -> None:
        files.setdefault(code.co_name, set()).add(code.co_filename)
        for const in code.co_consts:
            if hasattr(const, "co_filename"):
                collect(const)

    code = getattr(fn, "__code__", None)
    if code is not None:
        collect(code)
        for value in getattr(fn, "__globals__", {}).values():
            if getattr(value, "__module__", None) == fn.__module__ and hasattr(value, "__code__"):
                collect(value.__code__)
    lines = []
    for line in text.splitlines():
        match = _DYNAMIC_FRAME.match(line)
        names = files.get(match.group(3), set()) if match else set()
        if match and len(names) == 1:
            indent, number, name = match.groups()
            filename = next(iter(names))
            lines.append(f'{indent}File "{filename}", line {number}, in {name}')
            source = linecache.getline(filename, int(number)).strip()
            if source:
                lines.append(f"{indent}  {source}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _merge_events(per_rank: list[list[tuple]], backend: str) -> list[CollectiveEvent]:
    """One event per collective from every rank's own record of it."""
    merged = []
    for seq, calls in enumerate(zip(*per_rank, strict=False)):
        op = calls[0][0]
        kwargs = max((c[4] for c in calls), key=len)  # a scatter's axis is known at its source
        dtypes = [c[2] for c in calls if c[2] is not None]
        src = kwargs.get("src")
        nbytes = calls[src][3] if src is not None else max(c[3] for c in calls)
        merged.append(
            CollectiveEvent(
                seq=seq,
                op=op,
                shapes=tuple(c[1] for c in calls),
                dtype=dtypes[0] if dtypes else None,
                nbytes=nbytes,
                ranks=tuple(range(len(calls))),
                kwargs=dict(kwargs),
                backend=backend,
            )
        )
    return merged
