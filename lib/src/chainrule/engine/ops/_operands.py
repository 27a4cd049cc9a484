"""Operands as tensors: a Tensor passes through, a number or array takes the other's dtype."""

from __future__ import annotations

from chainrule.engine.tensor import ArrayLike, Tensor, as_tensor


def operand(x: ArrayLike) -> Tensor:
    """``x`` as a Tensor (a Tensor is returned unchanged, without a copy)."""
    return x if isinstance(x, Tensor) else as_tensor(x)


def operands(a: ArrayLike, b: ArrayLike) -> tuple[Tensor, Tensor]:
    """Both operands of a binary op as Tensors.

    A number or array next to a Tensor takes that Tensor's dtype, so ``float32_tensor * 2``
    stays float32.
    """
    if isinstance(a, Tensor):
        return a, (b if isinstance(b, Tensor) else as_tensor(b, like=a))
    if isinstance(b, Tensor):
        return as_tensor(a, like=b), b
    a = as_tensor(a)
    return a, as_tensor(b, like=a)


def shape_error(op: str, a: Tensor, b: Tensor, what: str = "do not broadcast") -> ValueError:
    """The error a binary op raises when its operands' shapes do not fit together."""
    return ValueError(f"{op}: shapes {a.data.shape} and {b.data.shape} {what}")
