"""The tensor type and the backward pass: reverse mode as a chain of vector-Jacobian products.

A :class:`Tensor` holds a numpy array. An operation that produces a tensor records, next to
its output, the tensors it read (its *parents*) and one function, its VJP, that maps the
gradient of the loss with respect to the output, ``ḡ = ∂L/∂out``, to the gradients with
respect to each parent, ``J_iᵀ ḡ``. Nothing else is stored: no Jacobian is ever built.

:meth:`Tensor.backward` then walks the graph from the output back to the leaves in reverse
topological order, calling each VJP once. The two rules of split graphs are the two lines
marked below: a tensor read by k operations receives the *sum* of its k incoming gradients
(fan-out becomes a sum), and an operation with several inputs hands each its own slice of
the gradient (for concatenation, that VJP is a split; see :func:`chainrule.engine.ops.concat`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

import numpy as np

ArrayLike = Any  # anything np.asarray accepts
VJP = Callable[[np.ndarray], Sequence[np.ndarray | None]]
OpObserver = Callable[["Tensor", Sequence["Tensor"]], None]

DEFAULT_DTYPE = np.float64

# A context variable, not a global: every simulated rank (a thread or a coroutine of its own)
# has its own grad mode.
_grad_enabled: ContextVar[bool] = ContextVar("chainrule_grad_enabled", default=True)
_op_observers: ContextVar[tuple[OpObserver, ...]] = ContextVar("chainrule_op_observers", default=())


def is_grad_enabled() -> bool:
    """Whether operations record the graph here (see :func:`no_grad`)."""
    return _grad_enabled.get()


@contextmanager
def no_grad() -> Iterator[None]:
    """Run operations without recording the graph (per rank: each simulated rank has its own)."""
    token = _grad_enabled.set(False)
    try:
        yield
    finally:
        _grad_enabled.reset(token)


@contextmanager
def enable_grad() -> Iterator[None]:
    """Record the graph again, also inside :func:`no_grad` (per rank, like ``no_grad``)."""
    token = _grad_enabled.set(True)
    try:
        yield
    finally:
        _grad_enabled.reset(token)


@contextmanager
def observe_ops(observer: OpObserver) -> Iterator[None]:
    """Call ``observer(out, parents)`` for every operation evaluated in this block, with grad
    mode on or off: how :func:`chainrule.engine.recompute.checkpoint` finds the tensors a
    function reads and :func:`chainrule.engine.memory.count_ops` counts the work (per rank)."""
    token = _op_observers.set((*_op_observers.get(), observer))
    try:
        yield
    finally:
        _op_observers.reset(token)


class Tensor:
    """A numpy array that remembers how it was computed.

    ``data`` is the array, ``grad`` the accumulated gradient ``∂L/∂self`` after
    :meth:`backward` (``None`` before), ``requires_grad`` whether gradients flow to it.
    """

    __slots__ = ("data", "grad", "requires_grad", "op", "_parents", "_vjp", "_retain", "name")
    __array_priority__ = 1000  # numpy array (op) Tensor defers to Tensor's reflected operator

    def __init__(
        self,
        data: ArrayLike,
        requires_grad: bool = False,
        dtype: Any = None,
        name: str | None = None,
    ) -> None:
        if isinstance(data, Tensor):
            data = data.data
        array = np.asarray(data, dtype=dtype)
        if dtype is None and not np.issubdtype(array.dtype, np.floating):
            array = array.astype(DEFAULT_DTYPE)
        self.data: np.ndarray = array
        self.grad: np.ndarray | None = None
        self.requires_grad = bool(requires_grad)
        self.op = "leaf"
        self._parents: tuple[Tensor, ...] = ()
        self._vjp: VJP | None = None
        self._retain = False
        self.name = name

    # -- building the graph -------------------------------------------------------------

    @classmethod
    def from_op(cls, data: np.ndarray, parents: Sequence[Tensor], vjp: VJP, op: str) -> Tensor:
        """The output of operation ``op``: ``data`` computed from ``parents``.

        ``vjp(ḡ)`` must return one gradient per parent (same shape as that parent, or
        ``None`` where no gradient flows). The graph is recorded only when some parent
        requires a gradient and grad mode is on.
        """
        out = cls.__new__(cls)
        # numpy returns 0-d results as immutable scalars; keep .data an array like a leaf's.
        out.data = data if type(data) is np.ndarray else np.asarray(data)
        out.grad = None
        out.op = op
        out._retain = False
        out.name = None
        if is_grad_enabled() and any(p.requires_grad for p in parents):
            out.requires_grad = True
            out._parents = tuple(parents)
            out._vjp = vjp
        else:
            out.requires_grad = False
            out._parents = ()
            out._vjp = None
        observers = _op_observers.get()
        if observers:  # only while something watches (recomputation, counting): else free
            for observe in observers:
                observe(out, parents)
        return out

    @property
    def is_leaf(self) -> bool:
        return self._vjp is None

    @property
    def parents(self) -> tuple[Tensor, ...]:
        """The tensors this one was computed from (empty for a leaf)."""
        return self._parents

    def retain_grad(self) -> Tensor:
        """Keep ``.grad`` on this intermediate tensor too (leaves always keep theirs)."""
        self._retain = True
        return self

    def detach(self) -> Tensor:
        """The same values, cut from the graph."""
        return Tensor(self.data)

    def zero_grad(self) -> None:
        self.grad = None

    # -- the backward pass --------------------------------------------------------------

    def backward(self, grad: ArrayLike | None = None) -> None:
        """Accumulate ``∂self/∂leaf``-weighted gradients into every leaf's ``.grad``.

        With ``grad=None`` the tensor must hold a single value (a scalar loss) and the seed
        is 1. Otherwise ``grad`` is the vector v of the VJP and must have this tensor's shape.
        """
        if not self.requires_grad:
            raise RuntimeError(
                "backward(): this tensor does not require a gradient "
                "(no input had requires_grad=True, or it was computed under no_grad())"
            )
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError(
                    f"backward() without a gradient needs a scalar, but the output of "
                    f"'{self.op}' has shape {self.data.shape}; pass grad= of that shape"
                )
            seed = np.ones_like(self.data)
        else:
            seed = np.asarray(grad.data if isinstance(grad, Tensor) else grad, self.data.dtype)
            if seed.shape != self.data.shape:
                raise ValueError(
                    f"backward(): grad has shape {seed.shape} but the output of '{self.op}' "
                    f"has shape {self.data.shape}"
                )

        backpropagate(self, seed)

    # -- conveniences -------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def numpy(self) -> np.ndarray:
        return self.data

    def item(self) -> float:
        return cast(float, self.data.item())

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        op = f", op={self.op}" if self.op != "leaf" else ""
        body = np.array2string(self.data, precision=4, separator=", ", prefix="tensor(")
        return f"tensor({body}{grad}{op})"

    # Operators and methods delegate to chainrule.engine.ops: each forward sits beside its VJP.
    def __add__(self, other: ArrayLike) -> Tensor:
        return _ops.add(self, other)

    def __radd__(self, other: ArrayLike) -> Tensor:
        return _ops.add(other, self)

    def __sub__(self, other: ArrayLike) -> Tensor:
        return _ops.sub(self, other)

    def __rsub__(self, other: ArrayLike) -> Tensor:
        return _ops.sub(other, self)

    def __mul__(self, other: ArrayLike) -> Tensor:
        return _ops.mul(self, other)

    def __rmul__(self, other: ArrayLike) -> Tensor:
        return _ops.mul(other, self)

    def __truediv__(self, other: ArrayLike) -> Tensor:
        return _ops.div(self, other)

    def __rtruediv__(self, other: ArrayLike) -> Tensor:
        return _ops.div(other, self)

    def __neg__(self) -> Tensor:
        return _ops.neg(self)

    def __pow__(self, exponent: ArrayLike) -> Tensor:
        return _ops.pow(self, exponent)

    def __matmul__(self, other: ArrayLike) -> Tensor:
        return _ops.matmul(self, other)

    def __rmatmul__(self, other: ArrayLike) -> Tensor:
        return _ops.matmul(other, self)

    def __getitem__(self, index: Any) -> Tensor:
        return _ops.getitem(self, index)

    def sum(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
        return _ops.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
        return _ops.mean(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape: int | tuple[int, ...]) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            return _ops.reshape(self, tuple(shape[0]))
        return _ops.reshape(self, shape)  # type: ignore[arg-type]  # (ints: checked by numpy)

    def transpose(self, *axes: int) -> Tensor:
        return _ops.transpose(self, axes or None)

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        return _ops.transpose(self, None)

    def exp(self) -> Tensor:
        return _ops.exp(self)

    def log(self) -> Tensor:
        return _ops.log(self)

    def tanh(self) -> Tensor:
        return _ops.tanh(self)

    def relu(self) -> Tensor:
        return _ops.relu(self)

    def sigmoid(self) -> Tensor:
        return _ops.sigmoid(self)


def tensor(data: ArrayLike, requires_grad: bool = False, dtype: Any = None) -> Tensor:
    """Make a leaf tensor (float64 unless ``dtype`` says otherwise, e.g. ``np.float32``)."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


def as_tensor(value: ArrayLike, like: Tensor | None = None) -> Tensor:
    """``value`` as a Tensor; a plain number or array takes the dtype of ``like``."""
    if isinstance(value, Tensor):
        return value
    dtype = like.data.dtype if like is not None else None
    return Tensor(value, dtype=dtype)


def backpropagate(
    root: Tensor, seed: np.ndarray, stop: Collection[Tensor] = ()
) -> dict[Tensor, np.ndarray]:
    """The backward pass from ``root`` with ``∂L/∂root = seed``: every VJP once, in reverse
    topological order, each leaf's gradient added to its ``.grad``.

    The walk ends at the tensors of ``stop``: their gradients are returned (a dict, without
    the tensors no gradient reached), not written to ``.grad``, and the graph behind them is
    not visited. :meth:`Tensor.backward` stops nowhere;
    :func:`chainrule.engine.recompute.checkpoint` stops at the inputs of the recomputed part.
    """
    stopped: dict[Tensor, np.ndarray] = {}
    grads: dict[Tensor, np.ndarray] = {root: seed}
    for node in reversed(topological_order(root, stop=stop)):
        g = grads.pop(node, None)
        if g is None:  # no path carried a gradient here (every VJP on the way gave None)
            continue
        if stop and node in stop:
            stopped[node] = g
            continue
        if node._vjp is None or node._retain:
            node.grad = np.asarray(g if node.grad is None else node.grad + g)
            if node._vjp is None:
                continue
        for parent, pg in zip(node._parents, node._vjp(g), strict=True):
            if pg is None or not parent.requires_grad:
                continue
            if pg.shape != parent.data.shape:
                raise RuntimeError(
                    f"the VJP of '{node.op}' returned a gradient of shape {pg.shape} "
                    f"for an input of shape {parent.data.shape}"
                )
            if parent in grads:
                # Rule 1, fan-out becomes a sum: a value read k times gets k gradients.
                grads[parent] = grads[parent] + pg
            else:
                grads[parent] = pg
    return stopped


def topological_order(
    root: Tensor, requires_grad_only: bool = True, stop: Collection[Tensor] = ()
) -> list[Tensor]:
    """Every tensor that ``root`` depends on (by default only those that require a gradient:
    the nodes the backward pass visits), parents first. A tensor of ``stop`` is listed but
    what it depends on is not (unless another path reaches it).

    Iterative depth-first search, so a chain of any length works; the order depends only on
    the graph, so every rank running the same program visits it identically.
    """
    order: list[Tensor] = []
    visited: set[Tensor] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in visited:
            continue
        visited.add(node)
        stack.append((node, True))
        if stop and node in stop:
            continue
        for parent in reversed(node._parents):
            if (parent.requires_grad or not requires_grad_only) and parent not in visited:
                stack.append((parent, False))
    return order


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` down to ``shape``: the VJP of numpy broadcasting.

    Broadcasting copies a value along new or size-1 axes; by rule 1 the copies' gradients add.
    """
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad


from chainrule.engine import ops as _ops  # noqa: E402  (ops import Tensor from this module)
