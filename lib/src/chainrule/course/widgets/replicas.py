"""What keeps P replicas one model: one clip coefficient, every rank in every collective, and
one reduction order (lesson 5).

- global gradient clipping of a gradient held in shards: :func:`clip_sharded`;
- non-deterministic reduction order: :func:`sums_in_every_order`, and :func:`replica_drift`,
  which trains P replicas side by side (:func:`train_replica`) and measures how far apart
  they end up.

Plots (:func:`plot_clip_coefficients`, :func:`plot_drift`) return matplotlib figures, and
:func:`build_drift_widget` puts live controls on top (see
:mod:`chainrule.course.widgets.live_widget`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from chainrule import dist
from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.course.widgets.tables import html_table

# -- global gradient clipping ----------------------------------------------------------------


@dataclass(frozen=True)
class ClipResult:
    """Clipping a gradient that lives in shards, one shard per rank.

    ``local_norms[p] = ‖g_p‖``; ``global_norm = √(Σ_p ‖g_p‖²)`` (the all-reduce of squared
    norms); ``local_coefficients[p] = min(1, c/‖g_p‖)`` is what rank p would use alone,
    ``global_coefficient = min(1, c/‖g‖)`` the one every rank must use.
    """

    max_norm: float
    local_norms: np.ndarray
    global_norm: float
    local_coefficients: np.ndarray
    global_coefficient: float
    locally_clipped: list[np.ndarray]
    globally_clipped: list[np.ndarray]


def clip_coefficient(norm: float, max_norm: float, eps: float = 1e-6) -> float:
    """``min(1, c/(‖g‖ + ε))``, the coefficient of ``torch.nn.utils.clip_grad_norm_``."""
    return float(min(1.0, max_norm / (norm + eps)))


def clip_sharded(shards: Sequence[np.ndarray], max_norm: float) -> ClipResult:
    """Clip the gradient held as ``shards`` (rank p holds ``shards[p]``) two ways.

    Locally, each rank scales its shard by its own coefficient: the directions change and the
    norm is wrong. Globally, ``‖g‖² = Σ_p ‖g_p‖²`` is all-reduced first, and every rank applies
    the same coefficient, which is exactly clipping the whole gradient on one device.
    """
    arrays = [np.asarray(s, dtype=float) for s in shards]
    local = np.array([np.linalg.norm(a) for a in arrays])
    total = float(np.sqrt(np.sum(local**2)))
    local_coef = np.array([clip_coefficient(n, max_norm) for n in local])
    global_coef = clip_coefficient(total, max_norm)
    return ClipResult(
        max_norm=max_norm,
        local_norms=local,
        global_norm=total,
        local_coefficients=local_coef,
        global_coefficient=global_coef,
        locally_clipped=[c * a for c, a in zip(local_coef, arrays, strict=True)],
        globally_clipped=[global_coef * a for a in arrays],
    )


def plot_clip_coefficients(clip: ClipResult) -> Figure:
    """Bars: the coefficient each rank would use alone, and the one coefficient for everyone."""
    figure = Figure(figsize=(6.5, 2.9))
    ax = figure.subplots()
    ranks = np.arange(len(clip.local_norms))
    ax.bar(ranks - 0.2, clip.local_coefficients, 0.4, label="each rank alone: $c_p$")
    ax.bar(
        ranks + 0.2, [clip.global_coefficient] * len(ranks), 0.4, label="after the all-reduce: $c$"
    )
    ax.set_xticks(ranks, [f"rank {p}" for p in ranks])
    ax.set_ylabel("clip coefficient")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("One coefficient for everyone, or a different rule per rank", fontsize=10)
    figure.tight_layout()
    return figure


# -- non-deterministic reduction order --------------------------------------------------------


def sums_in_every_order(values: Sequence[float], dtype: type = np.float32) -> dict[tuple, float]:
    """The left-to-right sum of ``values`` in every order, computed in ``dtype``.

    Keys are the orders (tuples of indices), values the sums. Real numbers would give one sum;
    floating-point addition is not associative, so several distinct sums appear.
    """
    arr: np.ndarray = np.asarray(values, dtype=dtype)
    sums: dict[tuple, float] = {}
    for order in itertools.permutations(range(len(arr))):
        total = arr[order[0]]
        for i in order[1:]:
            total = dtype(total + arr[i])
        sums[order] = float(total)
    return sums


@dataclass(frozen=True)
class DriftResult:
    """Replicas trained side by side: how far they are apart after each step.

    ``divergence[s] = max_p max_j |θ_p[j] − θ_0[j]|`` after step ``s + 1``; ``differing[s]``
    is the number of parameter entries in which some rank's bits differ from rank 0's.
    ``params[p]`` is rank p's final flat parameter vector, ``losses[s]`` rank 0's loss.
    """

    deterministic: bool
    divergence: np.ndarray
    differing: np.ndarray
    params: list[np.ndarray]
    losses: np.ndarray

    @property
    def steps(self) -> np.ndarray:
        return np.arange(1, len(self.divergence) + 1)

    @property
    def first_divergent_step(self) -> int | None:
        """The first step after which the replicas are not bitwise identical (None: never)."""
        nonzero = np.flatnonzero(self.differing)
        return int(nonzero[0]) + 1 if nonzero.size else None


@dataclass(frozen=True)
class DriftProblem:
    """A two-layer tanh network fitted to ``y = sin(x·a)`` by full-batch gradient descent.

    Model ``ŷ = tanh(x W₁) W₂``, loss ``L = (1/2n) Σ_i (ŷ_i − y_i)²`` over a shard of n
    examples. Gradients, with ``h = tanh(x W₁)`` and ``r = (ŷ − y)/n``:
    ``∇W₂ = hᵀ r`` and ``∇W₁ = xᵀ ((r W₂ᵀ) ⊙ (1 − h²))``.
    """

    x: np.ndarray
    y: np.ndarray
    w1: np.ndarray
    w2: np.ndarray

    @classmethod
    def make(
        cls,
        world_size: int,
        per_rank: int = 32,
        features: int = 4,
        hidden: int = 16,
        dtype: type = np.float32,
        seed: int = 0,
    ) -> DriftProblem:
        rng = np.random.default_rng(seed)
        n = per_rank * world_size
        x = rng.standard_normal((n, features))
        y = np.sin(x @ rng.standard_normal(features))[:, None]
        w1 = rng.standard_normal((features, hidden)) / np.sqrt(features)
        w2 = rng.standard_normal((hidden, 1)) / np.sqrt(hidden)
        return cls(*(a.astype(dtype) for a in (x, y, w1, w2)))

    @staticmethod
    def loss_and_grads(
        x: np.ndarray, y: np.ndarray, w1: np.ndarray, w2: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """``(L, ∇W₁, ∇W₂)`` on the examples ``x, y`` (formulas in the class docstring)."""
        h = np.tanh(x @ w1)
        residual = h @ w2 - y
        loss = float(0.5 * np.mean(residual**2))
        r = residual / len(x)
        grad_w2 = h.T @ r
        grad_w1 = x.T @ ((r @ w2.T) * (1 - h * h))
        return loss, grad_w1, grad_w2


def train_replica(problem: DriftProblem, steps: int, lr: float) -> tuple[np.ndarray, np.ndarray]:
    """SPMD: plain data-parallel gradient descent on this rank's shard; θ after every step.

    Rank p computes ``g_p`` on its shard at its *own* parameters, one all-reduce (sum) of the
    flattened gradients gives ``Σ_q g_q``, and ``θ ← θ − (lr/P) Σ_q g_q``. Returns the
    flattened parameters after each step, shape (steps, n_params), and this rank's shard loss
    before each step.
    """
    world, rank = dist.world_size(), dist.rank()
    idx = np.array_split(np.arange(len(problem.x)), world)[rank]
    x, y = problem.x[idx], problem.y[idx]
    w1, w2 = problem.w1.copy(), problem.w2.copy()
    step_size = problem.w1.dtype.type(lr / world)
    history = np.empty((steps, w1.size + w2.size), dtype=w1.dtype)
    losses = np.empty(steps)
    for s in range(steps):
        losses[s], g1, g2 = problem.loss_and_grads(x, y, w1, w2)
        total = np.asarray(dist.all_reduce(np.concatenate([g1.ravel(), g2.ravel()])))
        w1 = w1 - step_size * total[: w1.size].reshape(w1.shape)
        w2 = w2 - step_size * total[w1.size :].reshape(w2.shape)
        history[s, : w1.size], history[s, w1.size :] = w1.ravel(), w2.ravel()
    return history, losses


def replica_drift(
    world_size: int = 4,
    steps: int = 2000,
    deterministic: bool = False,
    lr: float = 0.5,
    dtype: type = np.float32,
    hidden: int = 16,
    seed: int = 0,
) -> DriftResult:
    """Train P replicas with data parallelism on the simulated world and measure their drift.

    Runs :func:`train_replica` under ``dist.run(..., deterministic=deterministic)``. With
    ``deterministic=True`` the all-reduce sums in rank order once and hands every rank the
    same bits, so the replicas stay bitwise identical forever. With ``deterministic=False``
    rank r sums in its own ring order ``g_r + g_{r+1} + … + g_{r−1}``: for P ≥ 3 the sums
    differ in the last bits (for P = 2 they cannot: ``a + b = b + a`` — addition is
    commutative, only associativity fails), the replicas stop being identical, and since each
    one's next gradient is taken at its own parameters, the differences accumulate.
    """
    if world_size < 2:
        raise ValueError("drift needs at least two ranks")
    problem = DriftProblem.make(world_size, hidden=hidden, dtype=dtype, seed=seed)
    runs = dist.run(
        train_replica, world_size, args=(problem, steps, lr), deterministic=deterministic
    )
    history = np.stack([h for h, _ in runs])  # (rank, step, param)
    gaps = np.abs(history[1:] - history[0])  # (rank - 1, step, param)
    return DriftResult(
        deterministic=deterministic,
        divergence=gaps.max(axis=(0, 2)).astype(float),
        differing=np.count_nonzero(gaps.max(axis=0), axis=1),
        params=[h[-1] for h in history],
        losses=runs[0][1],
    )


def plot_drift(results: Sequence[DriftResult]) -> Figure:
    """Left: the largest gap between replicas; right: entries that differ in bits.

    The gap is drawn on a log scale where some replica drifted; a gap of zero has no place on
    a log axis, so a reduction whose replicas never differ is named in the legend instead, and
    when none drifted (two ranks, or float64 over few steps) the left axis is linear, shows the
    zero lines and says so. The count axis starts at zero and counts in whole entries.
    """
    figure = Figure(figsize=(9, 3.2))
    left, right = figure.subplots(1, 2)
    drifted = [bool(np.any(r.divergence > 0)) for r in results]
    for colour, result, moved in zip(("C0", "C1"), results, drifted, strict=False):
        label = "same order on every rank" if result.deterministic else "each rank its own order"
        if any(drifted):
            if moved:
                positive = np.where(result.divergence > 0, result.divergence, np.nan)
                left.plot(result.steps, positive, color=colour, label=label)
            else:  # zero at every step: nothing to draw on a log axis, so a legend entry
                left.plot([], [], color=colour, linestyle=":", label=f"{label}: 0 at every step")
        else:
            left.plot(result.steps, result.divergence, color=colour, linewidth=2, clip_on=False)
        right.plot(result.steps, result.differing, color=colour, label=label)
    left.set_xlabel("step")
    left.set_ylabel("max |θ_p − θ_0|")
    if any(drifted):
        left.set_yscale("log")
        left.set_title("Replicas drift apart (log scale)")
        left.legend(fontsize=8)
    else:
        left.set_ylim(0, 1)
        left.set_yticks([0])
        left.set_title("No replica ever drifts")
        left.text(
            0.5,
            0.55,
            "max |θ_p − θ_0| = 0 at every step:\nthe replicas stay bitwise identical",
            transform=left.transAxes,
            ha="center",
            va="center",
            fontsize=9,
        )
    most = max((int(r.differing.max()) for r in results), default=0)
    right.set_ylim(0, max(1, most) * 1.1)
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("step")
    right.set_ylabel("entries not bitwise equal")
    right.set_title("Bitwise identical or not")
    right.legend(fontsize=8)
    figure.tight_layout()
    return figure


def _drift_table(results: tuple[DriftResult, DriftResult]) -> str:
    rows = []
    for r in results:
        first = r.first_divergent_step
        rows.append(
            [
                "deterministic (one order)" if r.deterministic else "per-rank order",
                "never" if first is None else first,
                f"{r.divergence[-1]:.3g}",
                f"{r.differing[-1]} of {r.params[0].size}",
            ]
        )
    return html_table(
        ["reduction", "first step not identical", "final max gap", "entries differing"], rows
    )


def build_drift_widget(world_size: int = 4, steps: int = 1000) -> LiveWidget:
    """Controls ``world_size``, ``steps``, ``lr`` and ``dtype``; both reductions side by side.

    ``last_result`` is the pair ``(deterministic, per-rank order)`` of :class:`DriftResult`.
    """
    controls = {
        "world_size": ipywidgets.IntSlider(value=world_size, min=2, max=8, description="ranks P"),
        "steps": ipywidgets.IntSlider(value=steps, min=50, max=1000, step=50, description="steps"),
        "lr": ipywidgets.FloatSlider(value=0.5, min=0.05, max=1.0, step=0.05, description="lr"),
        "dtype": ipywidgets.Dropdown(
            options=[("float32", np.float32), ("float64", np.float64)],
            value=np.float32,
            description="dtype",
        ),
    }

    def compute(world_size: int, steps: int, lr: float, dtype: type) -> tuple[Any, ...]:
        return tuple(
            replica_drift(world_size, steps, deterministic=d, lr=lr, dtype=dtype)
            for d in (True, False)
        )

    return LiveWidget(controls, compute, _drift_table, plot_drift)
