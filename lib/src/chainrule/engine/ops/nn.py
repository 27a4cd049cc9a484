"""Neural-network ops: softmax, log-softmax, losses, and the three normalisations.

Each is one op with an analytic VJP (not a composition of smaller ops), which is both what the
lessons derive and what keeps the backward pass short.

The normalisations share one VJP. With ``x̂ = (x - μ)·r`` (or ``x̂ = x·r`` without centring),
``r = 1/√(σ² + ε)`` and ``ĝ = ḡ·w`` (``ḡ`` when there is no weight), averaging over the
n normalised elements gives

    x̄ = r · (ĝ - mean(ĝ) - x̂ · mean(ĝ · x̂))      (centred: layer_norm, batch_norm)
    x̄ = r · (ĝ - x̂ · mean(ĝ · x̂))                (not centred: rms_norm)

and ``w̄ = Σ ḡ·x̂``, ``b̄ = Σ ḡ`` over the axes the weight was broadcast along.
"""

from __future__ import annotations

import numpy as np

from chainrule.engine.ops._operands import operand
from chainrule.engine.tensor import ArrayLike, Tensor, unbroadcast


def _stable_exp(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x - max x, e^(x - max x), Σ e^(x - max x))`` along ``axis``: no overflow."""
    shifted = x - x.max(axis=axis, keepdims=True)
    e = np.exp(shifted)
    return shifted, e, e.sum(axis=axis, keepdims=True)


def softmax(x: ArrayLike, axis: int = -1) -> Tensor:
    """``s = eˣ / Σ eˣ`` along ``axis``.  VJP: ``x̄ = s · (ḡ - Σ ḡ·s)``."""
    x = operand(x)
    _, e, total = _stable_exp(x.data, axis)
    s = e / total

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (s * (g - (g * s).sum(axis=axis, keepdims=True)),)

    return Tensor.from_op(s, (x,), vjp, "softmax")


def log_softmax(x: ArrayLike, axis: int = -1) -> Tensor:
    """``x - log Σ eˣ`` along ``axis`` (shifted by the max first).  VJP: ``x̄ = ḡ - s · Σ ḡ``."""
    x = operand(x)
    shifted, e, total = _stable_exp(x.data, axis)
    out = shifted - np.log(total)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g - (e / total) * g.sum(axis=axis, keepdims=True),)

    return Tensor.from_op(out, (x,), vjp, "log_softmax")


def cross_entropy(
    logits: ArrayLike,
    targets: ArrayLike,
    mask: ArrayLike | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Cross-entropy of ``logits`` (..., C) against integer class ``targets`` (...).

    Per position ``ℓ_i = -log softmax(z_i)[t_i]``. With a padding ``mask`` (1 = real token,
    0 = padding) the loss is ``Σ m_i ℓ_i``, divided by the number of real tokens ``Σ m_i`` when
    ``reduction="mean"`` (by the number of positions when there is no mask) and not divided
    when ``reduction="sum"``. The targets and the mask get no gradient.

    VJP: ``z̄_i = ḡ · c_i · (softmax(z_i) - onehot(t_i))`` with ``c_i = m_i / Σ m`` (mean) or
    ``c_i = m_i`` (sum).
    """
    logits = operand(logits)
    z = logits.data
    t = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
    if z.ndim == 0 or t.shape != z.shape[:-1]:
        raise ValueError(
            f"cross_entropy: targets of shape {t.shape} do not match logits of shape "
            f"{z.shape} (expected targets of shape {z.shape[:-1]})"
        )
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy: reduction must be 'mean' or 'sum', not {reduction!r}")
    if t.dtype.kind != "i" and t.dtype.kind != "u":
        if t.size and not np.array_equal(t, np.round(t)):
            raise ValueError(f"cross_entropy: targets must be integer classes, got {t.dtype}")
        t = t.astype(np.intp)
    n_classes = z.shape[-1]
    if t.size and (t.min() < 0 or t.max() >= n_classes):
        raise ValueError(
            f"cross_entropy: targets must lie in [0, {n_classes}) for logits of shape {z.shape}, "
            f"got values in [{t.min()}, {t.max()}]"
        )

    shifted, e, total = _stable_exp(z, -1)
    rows, cols = np.arange(t.size), t.reshape(-1)  # position i, class t_i (flattened)
    picked = shifted.reshape(-1, n_classes)[rows, cols].reshape(t.shape)
    losses = np.log(total[..., 0]) - picked  # ℓ_i
    if mask is None:
        weights = None
        loss = losses.sum()
        count = losses.size
    else:
        m = np.asarray(mask.data if isinstance(mask, Tensor) else mask, dtype=z.dtype)
        if m.shape != t.shape:
            raise ValueError(
                f"cross_entropy: mask of shape {m.shape} does not match targets of shape {t.shape}"
            )
        weights = m
        loss = (m * losses).sum()
        count = m.sum()
    scale = 1.0 / count if reduction == "mean" else 1.0
    out = np.asarray(loss * scale, dtype=z.dtype)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        grad = e / total  # softmax
        grad.reshape(-1, n_classes)[rows, cols] -= 1  # - onehot (a view of the fresh array)
        c = g * scale
        if weights is not None:
            c = (c * weights)[..., None]
        return (grad * c,)

    return Tensor.from_op(out, (logits,), vjp, "cross_entropy")


def mse_loss(pred: ArrayLike, target: ArrayLike, reduction: str = "mean") -> Tensor:
    """``Σ (pred - target)²``, divided by the number of elements when ``reduction="mean"``.

    VJP: ``p̄ = ḡ · 2(pred - target)/n`` (``n = 1`` for "sum") and ``t̄ = -p̄`` (un-broadcast).
    """
    pred = operand(pred)
    target = target if isinstance(target, Tensor) else Tensor(target, dtype=pred.data.dtype)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"mse_loss: reduction must be 'mean' or 'sum', not {reduction!r}")
    try:
        diff = pred.data - target.data
    except ValueError:
        raise ValueError(
            f"mse_loss: shapes {pred.data.shape} and {target.data.shape} do not broadcast"
        ) from None
    n = diff.size if reduction == "mean" else 1
    out = np.asarray(np.vdot(diff, diff) / n, dtype=diff.dtype)
    sp, st = pred.data.shape, target.data.shape
    need_t = target.requires_grad

    def vjp(g: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        d = (2 * g / n) * diff
        return unbroadcast(d, sp), (-unbroadcast(d, st) if need_t else None)

    return Tensor.from_op(out, (pred, target), vjp, "mse_loss")


def _normalized(
    x: Tensor,
    axis: int,
    weight: ArrayLike | None,
    bias: ArrayLike | None,
    eps: float,
    centre: bool,
    op: str,
) -> Tensor:
    """``x̂·w + b`` with ``x̂`` normalised along ``axis``; the shared forward and VJP."""
    xd = x.data
    parents = [x]
    w = b = None
    if weight is not None:
        w = weight if isinstance(weight, Tensor) else Tensor(weight, dtype=xd.dtype)
        parents.append(w)
    if bias is not None:
        b = bias if isinstance(bias, Tensor) else Tensor(bias, dtype=xd.dtype)
        parents.append(b)
    feature_shape = xd.shape[axis + 1 :] if axis == 0 else xd.shape[-1:]
    for name, p in (("weight", w), ("bias", b)):
        if p is not None and p.data.shape != feature_shape:
            raise ValueError(
                f"{op}: {name} of shape {p.data.shape} does not match input of shape "
                f"{xd.shape} (expected {feature_shape})"
            )

    xc = xd - xd.mean(axis=axis, keepdims=True) if centre else xd
    r = 1.0 / np.sqrt((xc * xc).mean(axis=axis, keepdims=True) + eps)
    xhat = xc * r
    out = xhat
    if w is not None:
        out = out * w.data
    if b is not None:
        out = out + b.data

    def vjp(g: np.ndarray) -> list[np.ndarray | None]:
        gh = g * w.data if w is not None else g  # ĝ
        inner = gh - xhat * (gh * xhat).mean(axis=axis, keepdims=True)
        if centre:
            inner -= gh.mean(axis=axis, keepdims=True)
        grads: list[np.ndarray | None] = [r * inner]
        if w is not None:
            grads.append(unbroadcast(g * xhat, w.data.shape) if w.requires_grad else None)
        if b is not None:
            grads.append(unbroadcast(g, b.data.shape) if b.requires_grad else None)
        return grads

    return Tensor.from_op(out, parents, vjp, op)


def layer_norm(
    x: ArrayLike,
    weight: ArrayLike | None = None,
    bias: ArrayLike | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Layer normalisation over the last axis: ``y = (x - μ)/√(σ² + ε) · w + b``.

    ``μ`` and the biased variance ``σ²`` are taken over the last axis of each row, so each
    example is normalised on its own (batch-independent). VJP, with ``x̂ = (x - μ)·r``,
    ``r = 1/√(σ² + ε)`` and ``ĝ = ḡ·w``: ``x̄ = r·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂))``,
    ``w̄ = Σ_rows ḡ·x̂``, ``b̄ = Σ_rows ḡ``.
    """
    return _normalized(operand(x), -1, weight, bias, eps, centre=True, op="layer_norm")


def rms_norm(x: ArrayLike, weight: ArrayLike | None = None, eps: float = 1e-6) -> Tensor:
    """RMS normalisation over the last axis: ``y = x / √(mean(x²) + ε) · w``.

    No centring, no bias; batch-independent like layer norm. VJP, with ``x̂ = x·r``,
    ``r = 1/√(mean(x²) + ε)`` and ``ĝ = ḡ·w``: ``x̄ = r·(ĝ - x̂·mean(ĝ·x̂))``,
    ``w̄ = Σ_rows ḡ·x̂``.
    """
    return _normalized(operand(x), -1, weight, None, eps, centre=False, op="rms_norm")


def batch_norm(
    x: ArrayLike,
    weight: ArrayLike | None = None,
    bias: ArrayLike | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Batch normalisation in training mode: statistics over the batch axis 0.

    ``y = (x - μ_B)/√(σ²_B + ε) · w + b`` with the mean and *biased* variance over axis 0
    (as PyTorch in training mode; for an input (N, C) this is exactly ``F.batch_norm``).
    Every output depends on every example of the batch, which is why splitting the batch
    across ranks changes the function. VJP, with ``x̂ = (x - μ_B)·r``, ``r = 1/√(σ²_B + ε)``
    and ``ĝ = ḡ·w``, means taken over the batch:

        x̄ = r·(ĝ - mean_B(ĝ) - x̂·mean_B(ĝ·x̂)),   w̄ = Σ_B ḡ·x̂,   b̄ = Σ_B ḡ.

    The input may have more axes (N, …); each position after axis 0 is normalised on its own.
    """
    return _normalized(operand(x), 0, weight, bias, eps, centre=True, op="batch_norm")
