"""The cost of a chain of Jacobians in the two association orders (reverse vs forward mode).

A chain of layers with widths ``d_0, d_1, …, d_n`` (input size ``d_0``, output size ``d_n``;
``d_n = 1`` for a scalar loss) has Jacobians ``J_k = ∂x_k/∂x_{k-1}`` of shape ``(d_k, d_{k-1})``
and the full Jacobian ``J = J_n ⋯ J_1`` of shape ``(d_n, d_0)``. Both orders below compute all
of ``J`` starting from an identity seed, and cost is counted in multiply-adds: multiplying an
``(a, b)`` matrix by a ``(b, c)`` matrix costs ``a·b·c`` (a matrix-vector product is ``c = 1``).

Reverse mode (right to left in ``x̄_0 = J_1ᵀ ⋯ J_nᵀ x̄_n``): seed ``X̄_n = I`` (``d_n`` columns,
one cotangent per output), then ``X̄_{k-1} = J_kᵀ X̄_k``, an ``(d_{k-1}, d_k)·(d_k, d_n)``
product::

    reverse_flops = Σ_{k=1..n} d_n · d_k · d_{k-1}  =  d_n · Σ_{k=1..n} d_k · d_{k-1}

i.e. ``d_n`` times the cost of one VJP sweep, and for a scalar loss (``d_n = 1``) exactly the
syllabus's ``Σ d_k·d_{k-1}``: a matrix-vector product at every step.

Forward accumulation (left to right: build the Jacobian products matrix by matrix from the
input side): seed ``Ẋ_0 = I`` (``d_0`` columns), then ``Ẋ_k = J_k Ẋ_{k-1}``, an
``(d_k, d_{k-1})·(d_{k-1}, d_0)`` product::

    forward_flops = Σ_{k=1..n} d_0 · d_{k-1} · d_k

which is the syllabus's ``Σ d_0·d_{k-1}·d_k``. (Multiplying ``J_1ᵀ J_2ᵀ ⋯`` out from the left
without a seed skips the k = 1 term ``d_0·d_0·d_1``, as reverse mode without a seed would skip
its k = n term.) The two counts are mirror images: ``forward_flops(d) = reverse_flops(d[::-1])``.

Their difference factorises: with fixed ``d_0 … d_{n-1}`` and output size ``m = d_n``,
``reverse - forward = (m - d_0)·(d_{n-1}·m + S)`` where ``S = Σ_{k<n} d_k·d_{k-1} ≥ 0``, so the
orders cost the same exactly at ``m = d_0`` (see :func:`crossover`): reverse mode wins whenever
there are fewer outputs than inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MatMul = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _check(widths: Sequence[int]) -> list[int]:
    ws = [int(w) for w in widths]
    if len(ws) < 2 or any(w < 1 for w in ws):
        raise ValueError(f"widths must be at least two positive sizes d_0..d_n, got {widths}")
    return ws


def reverse_flops(widths: Sequence[int]) -> int:
    """Multiply-adds of reverse mode: ``Σ_{k=1..n} d_n·d_k·d_{k-1}`` (seed ``I_{d_n}``)."""
    d = _check(widths)
    return sum(d[-1] * d[k] * d[k - 1] for k in range(1, len(d)))


def forward_flops(widths: Sequence[int]) -> int:
    """Multiply-adds of forward accumulation: ``Σ_{k=1..n} d_0·d_{k-1}·d_k`` (seed ``I_{d_0}``)."""
    d = _check(widths)
    return sum(d[0] * d[k - 1] * d[k] for k in range(1, len(d)))


def random_jacobians(widths: Sequence[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Random ``J_1 … J_n`` with ``J_k`` of shape ``(d_k, d_{k-1})``."""
    d = _check(widths)
    return [rng.standard_normal((d[k], d[k - 1])) for k in range(1, len(d))]


def reverse_accumulate(jacobians: Sequence[np.ndarray], matmul: MatMul = np.matmul) -> np.ndarray:
    """``J = J_n ⋯ J_1`` right to left in ``J_1ᵀ ⋯ J_nᵀ I``: ``X̄_{k-1} = J_kᵀ X̄_k``.

    Returns ``J`` of shape ``(d_n, d_0)``. ``matmul`` is the only multiplication used, so a
    counting one measures the cost.
    """
    bar = np.eye(jacobians[-1].shape[0])
    for jac in reversed(jacobians):
        bar = matmul(jac.T, bar)
    return bar.T


def forward_accumulate(jacobians: Sequence[np.ndarray], matmul: MatMul = np.matmul) -> np.ndarray:
    """``J = J_n ⋯ J_1`` from the input side: ``Ẋ_0 = I``, ``Ẋ_k = J_k Ẋ_{k-1}``.

    Returns ``J`` of shape ``(d_n, d_0)``.
    """
    dot = np.eye(jacobians[0].shape[1])
    for jac in jacobians:
        dot = matmul(jac, dot)
    return dot


@dataclass(frozen=True)
class ChainTiming:
    """Measured and counted cost of the two orders for one chain."""

    widths: tuple[int, ...]
    reverse_flops: int
    forward_flops: int
    reverse_seconds: float  # median over the repeats
    forward_seconds: float

    @property
    def flop_ratio(self) -> float:
        """``forward_flops / reverse_flops``: how many times cheaper reverse mode is."""
        return self.forward_flops / self.reverse_flops

    @property
    def time_ratio(self) -> float:
        """``forward_seconds / reverse_seconds``."""
        return self.forward_seconds / self.reverse_seconds


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def time_chain(
    widths: Sequence[int], repeats: int = 5, rng: np.random.Generator | None = None
) -> ChainTiming:
    """Build random Jacobians for ``widths`` and time both orders with numpy (median)."""
    d = _check(widths)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    jacobians = random_jacobians(d, np.random.default_rng() if rng is None else rng)
    return ChainTiming(
        widths=tuple(d),
        reverse_flops=reverse_flops(d),
        forward_flops=forward_flops(d),
        reverse_seconds=_median_seconds(lambda: reverse_accumulate(jacobians), repeats),
        forward_seconds=_median_seconds(lambda: forward_accumulate(jacobians), repeats),
    )


def crossover(widths_before_output: Sequence[int]) -> float:
    """The output size ``m`` at which reverse and forward mode cost the same.

    ``widths_before_output`` is ``d_0 … d_{n-1}`` (input and fixed hidden widths). Both costs
    are polynomials in ``m = d_n``: ``reverse(m) = d_{n-1}·m² + S·m`` and
    ``forward(m) = d_0·S + d_0·d_{n-1}·m``, with ``S = Σ_{k<n} d_k·d_{k-1}``. This solves
    ``reverse(m) = forward(m)`` for its positive root from the two cost functions; by the
    factorisation in the module docstring the answer is ``d_0``.
    """
    d = _check([*widths_before_output, 1])[:-1]

    def difference(m: int) -> int:
        return reverse_flops([*d, m]) - forward_flops([*d, m])

    # difference(m) = a·m² + b·m + c: read the coefficients off three evaluations.
    f1, f2, f3 = difference(1), difference(2), difference(3)
    a = (f3 - 2 * f2 + f1) / 2
    b = f2 - f1 - 3 * a
    c = f1 - a - b
    roots = np.roots([a, b, c])
    return max(float(r.real) for r in roots if abs(r.imag) < 1e-9 and r.real > 0)
