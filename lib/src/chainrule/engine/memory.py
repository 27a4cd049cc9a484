"""What a graph holds for its backward pass, and how much work a pass does: measured on the
engine, not modelled.

An operation keeps for its backward what its VJP reads. In this engine that is visible: the
output array of every node (``data``) and the arrays its VJP closure captured (a ``mul``
keeps both operands, a ``softmax`` its output, a ``layer_norm`` its ``x̂`` and ``1/σ``).
:func:`saved_bytes` walks the graph and adds up those arrays, each buffer once (a view counts
as the array it views), leaving out the leaves (parameters, inputs, constants), which exist
with or without a graph: what remains is the *activation memory*.

:func:`count_ops` counts the operations evaluated (every call of an op, graph on or off), and
:func:`measure_step` puts both together for one forward and backward pass, with
recomputation's second forward counted apart and the bytes a recomputed part holds while its
backward runs added to the peak.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from chainrule.engine import recompute
from chainrule.engine.tensor import Tensor, observe_ops, topological_order


def _owner(array: np.ndarray) -> np.ndarray:
    """The array that owns ``array``'s memory (itself, or the base of a view)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _captured(node: Tensor) -> Iterator[np.ndarray | Tensor]:
    """What ``node``'s VJP closure holds of arrays and tensors (also inside a tuple or list)."""
    cells = getattr(node._vjp, "__closure__", None) or ()
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        values: Sequence[Any] = value if isinstance(value, tuple | list) else (value,)
        yield from (v for v in values if isinstance(v, np.ndarray | Tensor))


def saved_bytes(root: Tensor, stop: Collection[Tensor] = ()) -> int:
    """Bytes of the activations the graph of ``root`` holds for the backward pass.

    Every array a node of the graph holds (its output, the arrays its VJP captured), each
    buffer once, without the leaves' arrays. The walk ends at the tensors of ``stop``, whose
    arrays are not counted either (they are someone else's: a recomputed part stops at its
    inputs, which the enclosing graph already holds).
    """
    order = topological_order(root, requires_grad_only=False, stop=stop)
    nodes = [t for t in order if not (t.is_leaf or t in stop)]
    captured = {node: list(_captured(node)) for node in nodes}
    # A leaf a closure holds (a checkpoint keeps its inputs, also those that need no gradient)
    # is not an activation either.
    others = [v for values in captured.values() for v in values if isinstance(v, Tensor)]
    excluded = {id(_owner(t.data)) for t in (*order, *others) if t.is_leaf or t in stop}
    held: dict[int, int] = {}
    for node in nodes:
        for value in (node.data, *captured[node]):
            owner = _owner(value.data if isinstance(value, Tensor) else value)
            if id(owner) not in excluded:
                held[id(owner)] = owner.nbytes
    return sum(held.values())


@contextmanager
def count_ops() -> Iterator[Counter[str]]:
    """Count the operations evaluated in this block by name (``counts["matmul"]``); a
    checkpoint's own node is counted under ``"checkpoint"``, the operations inside it under
    their names, each time they run."""
    counts: Counter[str] = Counter()

    def count(out: Tensor, parents: Sequence[Tensor]) -> None:
        counts[out.op] += 1

    with observe_ops(count):
        yield counts


def matmul_flops(out: Tensor, parents: Sequence[Tensor]) -> int:
    """Floating-point operations of one matrix product: ``2·k`` (a multiply and an add per
    term of the inner dimension ``k``) for each output element; 0 for any other op (they are
    elementwise or reductions, cheap next to the products of a layer)."""
    if out.op != "matmul":
        return 0
    return 2 * int(out.data.size) * int(parents[0].data.shape[-1])


@contextmanager
def count_flops() -> Iterator[list[int]]:
    """The floating-point operations of the matrix products evaluated in this block, graph on
    or off: ``flops[0]`` (see :func:`matmul_flops`)."""
    total = [0]

    def count(out: Tensor, parents: Sequence[Tensor]) -> None:
        total[0] += matmul_flops(out, parents)

    with observe_ops(count):
        yield total


def evaluations(counts: Counter[str]) -> int:
    """The number of operations evaluated, a checkpoint's own node left out (it computes
    nothing: the operations inside it are counted)."""
    return sum(n for op, n in counts.items() if op != recompute.CHECKPOINT_OP)


@dataclass(frozen=True)
class StepMeasurement:
    """One forward and backward pass, measured.

    ``saved_bytes``: activations the graph holds when the backward starts;
    ``peak_bytes``: the most held at once during the backward (``saved_bytes`` plus the parts
    rebuilt by recomputation that exist at the same time); ``forward_ops`` and
    ``recomputed_ops``: operations evaluated in the forward, and again in the backward;
    ``forward_counts``, ``recomputed_counts``: the same by op name; ``forward_flops``,
    ``recomputed_flops``: the floating-point operations of their matrix products.
    """

    saved_bytes: int
    peak_bytes: int
    forward_counts: Counter[str]
    recomputed_counts: Counter[str]
    forward_flops: int
    recomputed_flops: int

    @property
    def forward_ops(self) -> int:
        return evaluations(self.forward_counts)

    @property
    def recomputed_ops(self) -> int:
        return evaluations(self.recomputed_counts)


class _RebuiltBytes:
    """The bytes of the recomputed parts alive at one moment, and the most at any moment."""

    def __init__(self) -> None:
        self.alive: list[int] = []
        self.most = 0

    def rebuilt(self, root: Tensor, parents: Sequence[Tensor]) -> None:
        self.alive.append(saved_bytes(root, stop=frozenset(parents)))
        self.most = max(self.most, sum(self.alive))

    def dropped(self) -> None:
        self.alive.pop()


def measure_step(loss_fn: Callable[[], Tensor]) -> StepMeasurement:
    """Run ``loss = loss_fn()`` and ``loss.backward()``, measuring the activation bytes at the
    start of the backward and at its peak, and the operations evaluated in each pass.

    Gradients are accumulated into the parameters as by any backward pass.
    """
    with count_ops() as forward, count_flops() as forward_flops:
        loss = loss_fn()
    stored = saved_bytes(loss)
    meter = _RebuiltBytes()
    with (
        recompute.observe_rebuilds(meter.rebuilt, meter.dropped),
        count_ops() as backward,
        count_flops() as backward_flops,
    ):
        loss.backward()
    return StepMeasurement(
        stored, stored + meter.most, forward, backward, forward_flops[0], backward_flops[0]
    )
