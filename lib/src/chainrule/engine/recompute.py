"""Activation recomputation ("checkpointing"): a part of the graph run again in the backward
instead of kept from the forward.

The backward pass of ``y = f(x)`` needs what ``f``'s VJPs read: the intermediate values of
``f``, which the graph keeps from the forward until the backward (the *activations*).
:func:`checkpoint` transforms the graph: the forward runs ``f`` without recording it, so its
intermediate values are freed as soon as they are used, and puts a single node in the graph,

    y = checkpoint(f, x),   parents: x and every tensor f read that needs a gradient,

whose VJP first runs ``f`` again, this time recording its graph, then backpropagates ``ȳ``
through that rebuilt graph down to the parents, and drops it. The same VJPs run on the same
values in the same order, so the gradients are the same as without the checkpoint (bit for
bit, as long as a value read both inside and outside ``f`` does not change the order in which
its gradients are added). The price is one more forward evaluation of ``f`` in the backward.

- **Full recomputation**: every layer (or every group of layers, :func:`checkpoint_sequential`)
  is a checkpoint; only the values between the segments are stored.
- **Selective recomputation**: only some cheap operations with large outputs are a checkpoint,
  for example the attention scores and their softmax, which are (tokens × tokens) per head.

The names and the behaviour follow ``torch.utils.checkpoint``: ``checkpoint(function, *args)``
and ``checkpoint_sequential(functions, segments, input)``. ``function`` must compute the same
values when run again (no fresh randomness, no state it changes); the backward checks that it
did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from chainrule.engine.ops._operands import operand
from chainrule.engine.tensor import (
    ArrayLike,
    Tensor,
    backpropagate,
    enable_grad,
    no_grad,
    observe_ops,
)

CHECKPOINT_OP = "checkpoint"
"""The op name of the node a checkpoint puts in the graph."""

Rebuilt = Callable[[Tensor, Sequence[Tensor]], None]
Dropped = Callable[[], None]
_rebuild_observers: ContextVar[tuple[tuple[Rebuilt, Dropped], ...]] = ContextVar(
    "chainrule_rebuild_observers", default=()
)


@contextmanager
def observe_rebuilds(rebuilt: Rebuilt, dropped: Dropped) -> Iterator[None]:
    """In this block, call ``rebuilt(output, parents)`` when a checkpoint's backward has run its
    function again (the rebuilt graph from ``output`` down to ``parents`` exists now), and
    ``dropped()`` when its backward is done with it. Nested checkpoints nest the calls.
    (:func:`chainrule.engine.memory.measure_step` adds up the bytes alive at once.)"""
    token = _rebuild_observers.set((*_rebuild_observers.get(), (rebuilt, dropped)))
    try:
        yield
    finally:
        _rebuild_observers.reset(token)


def checkpoint(function: Callable[..., Tensor], *inputs: Any) -> Tensor:
    """``function(*inputs)``, with ``function``'s intermediate values recomputed in the backward
    instead of stored.

    ``inputs`` are handed to ``function`` as they are (tensors, arrays, numbers, anything) and
    kept for the second run. Forward: ``function`` runs with the graph off (:func:`no_grad`),
    watched (:func:`observe_ops`) to find every tensor it reads that needs a gradient and that
    it did not compute itself: the inputs, and the parameters it reads from its closure. They
    become the parents of one ``checkpoint`` node holding the output; the node keeps them, the
    inputs and ``function``, nothing computed inside.

    Backward (the node's VJP): run ``function`` again with the graph on, check that it gives
    the output of the forward, and backpropagate ``ȳ`` through the rebuilt graph to the parents
    (:func:`backpropagate` stopping there); return their gradients; drop the rebuilt graph.
    """
    args = inputs  # handed to function as given, tensors or not (as torch does)
    made: set[int] = set()  # ids of the tensors function computes (alive or not)
    read: dict[int, Tensor] = {}  # what it reads that it did not compute and needs a gradient

    def watch(out: Tensor, parents: Sequence[Tensor]) -> None:
        for p in parents:
            if p.requires_grad and id(p) not in made:
                read.setdefault(id(p), p)
        made.add(id(out))  # an id of a freed tensor can come back only for another of function's

    with no_grad(), observe_ops(watch):
        out = function(*args)
    if not isinstance(out, Tensor):
        raise TypeError(f"checkpoint: the function must return one Tensor, not {type(out)}")
    output = out.data
    parents = tuple(read.values())
    stop = frozenset(parents)

    def vjp(g: np.ndarray) -> list[np.ndarray | None]:
        with enable_grad():
            rebuilt = function(*args)
        if rebuilt.data.shape != output.shape or not np.array_equal(
            rebuilt.data, output, equal_nan=True
        ):
            raise RuntimeError(
                "checkpoint: run again in the backward, the function gave another output than "
                "in the forward; it must compute the same values each time (no fresh random "
                "numbers, no state that changes between the two runs)"
            )
        if not rebuilt.requires_grad:
            return [None] * len(parents)
        observers = _rebuild_observers.get()
        for rebuilt_graph, _ in observers:
            rebuilt_graph(rebuilt, parents)
        try:
            grads = backpropagate(rebuilt, g, stop)
        finally:
            for _, dropped in observers:
                dropped()
        return [grads.get(p) for p in parents]

    return Tensor.from_op(output, parents, vjp, CHECKPOINT_OP)


def checkpoint_sequential(
    functions: Sequence[Callable[[Tensor], Tensor]], segments: int, input: ArrayLike
) -> Tensor:
    """Run ``functions`` one after another on ``input``, cut into ``segments`` consecutive
    segments of (nearly) equal length, each segment a :func:`checkpoint`.

    Stored: the input of every segment; recomputed in the backward: everything inside a
    segment. As in ``torch.utils.checkpoint.checkpoint_sequential``, the last segment is run
    normally (its values are stored), because its backward comes first and recomputing it at
    once would gain nothing. With ``segments = 1`` nothing is recomputed.
    """
    n = len(functions)
    if not 1 <= segments <= max(n, 1):
        raise ValueError(f"checkpoint_sequential: segments must lie in [1, {n}], got {segments}")
    bounds = [round(i * n / segments) for i in range(segments + 1)]
    x = operand(input)
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        part = functions[start:stop]

        def run(t: Tensor, part: Sequence[Callable[[Tensor], Tensor]] = part) -> Tensor:
            for f in part:
                t = f(t)
            return t

        x = run(x) if i == segments - 1 else checkpoint(run, x)
    return x
