"""The optimizer: stochastic gradient descent with momentum, ``v ← μ v + g``, ``θ ← θ − η v``.

PyTorch's convention (v starts at 0; μ = 0 is plain SGD). One contract: :func:`update` writes
only the velocity (the optimizer's state) and returns a new θ, or writes it into ``out`` (θ
itself, for a buffer the caller owns); :class:`SGD` gives each parameter a new array, so an
array someone else holds (another simulated rank, the caller) is never written into.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def update(
    theta: Any, grad: Any, lr: float, velocity: Any = None, momentum: float = 0.0, out: Any = None
) -> Any:
    """``θ − η v`` with ``v ← μ v + g`` (``velocity``, in place; without one, v is g)."""
    if velocity is not None:
        velocity *= momentum
        velocity += grad
        grad = velocity
    if out is None:
        return theta - lr * grad
    out -= lr * grad
    return out


class SGD:
    """SGD with momentum over ``params`` (leaves with a ``.grad``), as ``torch.optim.SGD``:
    :meth:`step` moves each parameter that has a gradient; ``velocity`` holds its v."""

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0) -> None:
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.velocity: list[Any] = [None] * len(self.params)

    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            if self.momentum and self.velocity[i] is None:  # v = 0 at first
                g = p.grad
                self.velocity[i] = np.zeros_like(g) if isinstance(g, np.ndarray) else 0 * g
            p.data = update(p.data, p.grad, self.lr, self.velocity[i], self.momentum)

    def zero_grad(self) -> None:
        """Forget the gradients (``backward`` adds into ``.grad``)."""
        for p in self.params:
            p.grad = None


def sgd_step(params: Iterable[Any], lr: float) -> None:
    """One step of plain SGD, ``θ ← θ − η g``, for every parameter that has a gradient."""
    SGD(params, lr).step()


def zero_grad(params: Iterable[Any]) -> None:
    SGD(params, 0.0).zero_grad()
