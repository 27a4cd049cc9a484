"""Tiny modules on top of the engine: a linear layer and a multi-layer perceptron.

The conventions are PyTorch's, so a state can be copied across: ``Linear`` holds ``weight`` of
shape (out_features, in_features) and ``bias`` of shape (out_features,) and computes
``y = x Wᵀ + b``, initialised uniformly in ``±1/√in_features``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from chainrule.engine import ops
from chainrule.engine.tensor import Tensor

Activation = Callable[[Tensor], Tensor]
ACTIVATIONS: dict[str, Activation] = {"tanh": ops.tanh, "relu": ops.relu, "sigmoid": ops.sigmoid}


class Linear:
    """``y = x Wᵀ + b`` for ``x`` of shape (..., in_features)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rng: np.random.Generator,
        bias: bool = True,
        dtype: Any = np.float64,
    ) -> None:
        bound = 1.0 / np.sqrt(in_features)
        shape = (out_features, in_features)
        self.weight = Tensor(rng.uniform(-bound, bound, shape), requires_grad=True, dtype=dtype)
        self.bias = (
            Tensor(rng.uniform(-bound, bound, out_features), requires_grad=True, dtype=dtype)
            if bias
            else None
        )

    def __call__(self, x: Tensor) -> Tensor:
        y = ops.matmul(x, ops.transpose(self.weight))
        return y if self.bias is None else ops.add(y, self.bias)

    def parameters(self) -> list[Tensor]:
        return [self.weight] if self.bias is None else [self.weight, self.bias]


class MLP:
    """Linear layers of the given ``widths`` (d_0 → d_1 → … → d_n), an activation between them.

    No activation after the last layer: it returns logits or predictions.
    """

    def __init__(
        self,
        widths: Sequence[int],
        rng: np.random.Generator,
        activation: str | Activation = "tanh",
        dtype: Any = np.float64,
    ) -> None:
        if len(widths) < 2:
            raise ValueError(f"MLP: needs at least an input and an output width, got {widths}")
        self.layers = [
            Linear(d_in, d_out, rng, dtype=dtype)
            for d_in, d_out in zip(widths[:-1], widths[1:], strict=True)
        ]
        self.activation = ACTIVATIONS[activation] if isinstance(activation, str) else activation

    def __call__(self, x: Tensor) -> Tensor:
        *hidden, last = self.layers
        for layer in hidden:
            x = self.activation(layer(x))
        return last(x)

    def parameters(self) -> list[Tensor]:
        return [p for layer in self.layers for p in layer.parameters()]


def num_parameters(parameters: Iterable[Tensor]) -> int:
    """The number of scalar parameters."""
    return int(sum(p.data.size for p in parameters))
