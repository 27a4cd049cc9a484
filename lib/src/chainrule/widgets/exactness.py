"""Where the exactness of data parallelism quietly breaks: the computations behind lesson 4.

The proof that averaging shard gradients gives the full-batch gradient,

    ∇L = (1/|B|) Σ_p Σ_{i∈B_p} ∇ℓ_i = (1/P) Σ_p ∇L_p      (|B_p| = |B|/P),

rests on three assumptions (:data:`PROOF_ASSUMPTIONS`). Each row of :data:`EXACTNESS_TABLE`
(the syllabus's table) is a way real training breaks one of them; this module computes the
demonstration of each row:

- uneven token counts: :func:`token_weighting`, :func:`mean_of_local_means`,
  :func:`token_weighted_mean`;
- batch norm versus batch-independent norms: :func:`sharded_norm_gradient`,
  :func:`norm_split_gaps`, :func:`normalize_by_shard`;
- global gradient clipping: :func:`clip_sharded`;
- non-deterministic reduction order: :func:`sums_in_every_order`, :func:`replica_drift`.

Plots (:func:`plot_token_weights`, :func:`plot_drift`, :func:`plot_norm_gaps`) return
matplotlib figures, and :func:`build_token_weight_widget` / :func:`build_drift_widget` put
live controls on top (see :mod:`chainrule.widgets.live`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import ipywidgets
import numpy as np
from matplotlib.figure import Figure

from chainrule import dist, ops
from chainrule.tensor import Tensor
from chainrule.widgets.live import LiveWidget, html_table, markdown_table

# -- the three assumptions and the table ------------------------------------------------------

PROOF_ASSUMPTIONS: tuple[str, ...] = (
    "the loss is a sum over examples",
    "the shards are equal in weight",
    "every rank starts from the same θ",
)


@dataclass(frozen=True)
class ExactnessRow:
    """One row of the syllabus's table: a situation, what goes wrong, and the fix.

    ``assumption`` is the index in :data:`PROOF_ASSUMPTIONS` of the assumption the situation
    breaks (or the step of the proof it breaks, for the two rows about the collective itself).
    """

    situation: str
    what_goes_wrong: str
    fix: str
    assumption: int


EXACTNESS_TABLE: tuple[ExactnessRow, ...] = (
    ExactnessRow(
        "Uneven token counts per rank",
        "Language-model loss is a mean over tokens, not sequences. If ranks hold different "
        "numbers of real (non-padding) tokens, a plain gradient mean weights every rank "
        "equally and therefore weights short-sequence tokens more heavily.",
        "Scale each rank's loss by its local token count, all-reduce the gradient with sum, "
        "and divide by the all-reduced global token count.",
        1,
    ),
    ExactnessRow(
        "Batch normalization",
        "Statistics are computed within a shard, so the function itself depends on how the "
        "batch was split. The gradient is genuinely different, not just rearranged.",
        "Use a batch-independent norm (LayerNorm, RMSNorm) — which is what transformers do — "
        "or synchronize the statistics explicitly.",
        0,
    ),
    ExactnessRow(
        "Global gradient clipping",
        "The clip coefficient depends on the norm of the whole gradient, which no single rank "
        "possesses.",
        "All-reduce the sum of squared norms first, then apply the same coefficient on every rank.",
        2,
    ),
    ExactnessRow(
        "A rank drops out of the collective",
        "With a variable number of batches per rank, one rank finishes early and the others "
        "block forever, or worse, proceed with a stale gradient.",
        "Pad the epoch to a common length, or use a join-style protocol.",
        2,
    ),
    ExactnessRow(
        "Non-deterministic reduction order",
        "Floating-point addition is not associative, so different ranks can produce "
        "marginally different sums and drift apart over thousands of steps.",
        "Rely on the collective to return a bitwise-identical result to all ranks, which "
        "correct all-reduce implementations guarantee.",
        2,
    ),
)


def exactness_table_markdown(with_assumption: bool = False) -> str:
    """:data:`EXACTNESS_TABLE` as Markdown (Situation | What goes wrong | Fix).

    With ``with_assumption=True`` a fourth column names the assumption each row breaks.
    """
    header = ["Situation", "What goes wrong", "Fix"]
    rows = [[r.situation, r.what_goes_wrong, r.fix] for r in EXACTNESS_TABLE]
    if with_assumption:
        header.append("Assumption broken")
        for row, r in zip(rows, EXACTNESS_TABLE, strict=True):
            row.append(PROOF_ASSUMPTIONS[r.assumption])
    return markdown_table(header, rows)


# -- uneven token counts ---------------------------------------------------------------------


@dataclass(frozen=True)
class TokenWeighting:
    """How much one token on each rank weighs in the reduced gradient.

    With ``G_p`` the sum of the per-token gradients over the ``T_p`` real tokens of rank p:

    - a plain mean of local means, ``(1/P) Σ_p G_p/T_p``, gives a token on rank p the weight
      ``naive[p] = 1/(P·T_p)``;
    - the true gradient of the mean over all tokens, ``Σ_p G_p / Σ_p T_p``, gives every token
      the weight ``exact = 1/Σ_p T_p``.

    ``relative[p] = naive[p]/exact`` is how many times its fair share a token on rank p gets.
    """

    token_counts: tuple[int, ...]
    naive: tuple[Fraction, ...]
    exact: Fraction

    @property
    def relative(self) -> tuple[Fraction, ...]:
        return tuple(w / self.exact for w in self.naive)

    @property
    def world_size(self) -> int:
        return len(self.token_counts)


def token_weighting(token_counts: Sequence[int]) -> TokenWeighting:
    """The per-token weights of a plain mean of local means versus the true token mean.

    >>> token_weighting([900, 300]).naive
    (Fraction(1, 1800), Fraction(1, 600))
    """
    counts = tuple(int(t) for t in token_counts)
    if not counts or any(t <= 0 for t in counts):
        raise ValueError(f"every rank needs at least one real token, got {counts}")
    world = len(counts)
    naive = tuple(Fraction(1, world * t) for t in counts)
    return TokenWeighting(counts, naive, Fraction(1, sum(counts)))


def mean_of_local_means(token_grads: Sequence[np.ndarray]) -> np.ndarray:
    """``(1/P) Σ_p mean_i g_{p,i}``: what a plain mean all-reduce of local mean gradients gives.

    ``token_grads[p]`` holds rank p's per-token gradients along axis 0.
    """
    return np.mean([np.mean(g, axis=0) for g in token_grads], axis=0)


def token_weighted_mean(
    local_means: Sequence[np.ndarray], token_counts: Sequence[int]
) -> np.ndarray:
    """The fix: ``Σ_p T_p·mean_p / Σ_p T_p`` (the two sums are the two all-reduces).

    ``T_p·mean_p = G_p`` is rank p's sum of per-token gradients, so this is the gradient of the
    mean over all ``Σ T_p`` tokens.
    """
    total = sum(t * np.asarray(m) for t, m in zip(token_counts, local_means, strict=True))
    return total / sum(token_counts)


def plot_token_weights(weighting: TokenWeighting) -> Figure:
    """Bars: the weight of one token on each rank, plain mean of means versus the true mean."""
    figure = Figure(figsize=(6, 3.2))
    ax = figure.subplots()
    ranks = np.arange(weighting.world_size)
    ax.bar(ranks - 0.2, [float(w) for w in weighting.naive], 0.4, label="plain mean of means")
    ax.bar(ranks + 0.2, [float(weighting.exact)] * len(ranks), 0.4, label="true token mean")
    for p, (w, rel) in enumerate(zip(weighting.naive, weighting.relative, strict=True)):
        ax.annotate(
            f"1/{w.denominator}\n({float(rel):.2f}×)",
            (p - 0.2, float(w)),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(ranks, [f"rank {p}\nT={t}" for p, t in enumerate(weighting.token_counts)])
    ax.set_ylabel("weight of one token")
    ax.set_ylim(0, 1.35 * max(float(w) for w in weighting.naive))
    ax.legend(fontsize=8)
    ax.set_title("Per-token weight in the reduced gradient")
    return figure


def _token_weight_table(weighting: TokenWeighting) -> str:
    rows = [
        [
            f"rank {p}",
            t,
            f"1/{w.denominator}",
            f"1/{weighting.exact.denominator}",
            f"{float(r):.3g}×",
        ]
        for p, (t, w, r) in enumerate(
            zip(weighting.token_counts, weighting.naive, weighting.relative, strict=True)
        )
    ]
    return html_table(
        ["rank", "real tokens T_p", "weight, plain mean", "weight, true mean", "share"], rows
    )


def build_token_weight_widget(
    token_counts: Sequence[int] = (900, 300), max_tokens: int = 2000
) -> LiveWidget:
    """One slider per rank (``controls["T_0"]``, ``controls["T_1"]``, ...) for its token count.

    ``last_result`` is the :class:`TokenWeighting`; the table lists each rank's per-token
    weight under the plain mean and the true mean, the plot shows them as bars.
    """
    controls = {
        f"T_{p}": ipywidgets.IntSlider(value=t, min=1, max=max_tokens, description=f"T_{p}")
        for p, t in enumerate(token_counts)
    }

    def compute(**counts: int) -> TokenWeighting:
        return token_weighting([counts[f"T_{p}"] for p in range(len(counts))])

    return LiveWidget(controls, compute, _token_weight_table, plot_token_weights)


# -- batch norm versus batch-independent norms -----------------------------------------------

NORMS: dict[str, Callable[[Tensor], Tensor]] = {
    "batch_norm": ops.batch_norm,
    "layer_norm": ops.layer_norm,
    "rms_norm": ops.rms_norm,
}


def _norm_loss(norm: str, x: np.ndarray, targets: np.ndarray, weight: Tensor) -> Tensor:
    """``L(W) = mean((norm(x W) - t)²)``: a linear layer, a normalisation, a squared error."""
    return ops.mse_loss(NORMS[norm](Tensor(x) @ weight), targets)


def norm_gradient(norm: str, x: np.ndarray, targets: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``∇_W L`` on the examples ``x`` (one device, one batch)."""
    w = Tensor(weight, requires_grad=True)
    _norm_loss(norm, x, targets, w).backward()
    return w.grad


def sharded_norm_gradient(
    norm: str, x: np.ndarray, targets: np.ndarray, weight: np.ndarray, world_size: int
) -> np.ndarray:
    """``(1/P) Σ_p ∇_W L_p`` with each shard normalised on its own (equal shards along axis 0).

    For a batch-independent norm (LayerNorm, RMSNorm) each example's output depends only on
    that example, so ``L`` is a mean over examples and this equals :func:`norm_gradient` on
    the whole batch. For batch norm, ``L_p`` uses shard statistics: a different function.
    """
    x_shards = np.split(x, world_size)
    t_shards = np.split(targets, world_size)
    grads = [norm_gradient(norm, xs, ts, weight) for xs, ts in zip(x_shards, t_shards, strict=True)]
    return np.mean(grads, axis=0)


def norm_split_gaps(
    x: np.ndarray, targets: np.ndarray, weight: np.ndarray, world_sizes: Sequence[int]
) -> dict[str, list[float]]:
    """For each norm, ``max |(1/P)Σ_p ∇L_p - ∇L|`` at each world size P."""
    return {
        norm: [
            float(
                np.abs(
                    sharded_norm_gradient(norm, x, targets, weight, p)
                    - norm_gradient(norm, x, targets, weight)
                ).max()
            )
            for p in world_sizes
        ]
        for norm in NORMS
    }


def normalize_by_shard(norm: str, h: np.ndarray, world_size: int) -> np.ndarray:
    """``norm`` applied to each of ``world_size`` equal shards of ``h`` on its own, re-joined.

    The forward pass a data-parallel run computes: for batch norm the output for one example
    changes with the split; for LayerNorm and RMSNorm it does not.
    """
    return np.concatenate([NORMS[norm](Tensor(s)).data for s in np.split(h, world_size)])


def plot_norm_gaps(world_sizes: Sequence[int], gaps: Mapping[str, Sequence[float]]) -> Figure:
    """The gradient gap versus the number of shards, one line per norm (log axis).

    Gaps below 1e-18 (exact zeros, e.g. at P = 1) are drawn at 1e-18; the dotted line is the
    float64 machine epsilon, the level of rounding.
    """
    floor = 1e-18
    figure = Figure(figsize=(6, 3.2))
    ax = figure.subplots()
    for norm, values in gaps.items():
        ax.plot(list(world_sizes), [max(v, floor) for v in values], marker="o", label=norm)
    ax.axhline(np.finfo(np.float64).eps, color="grey", linestyle=":", linewidth=1)
    ax.annotate(
        "float64 rounding",
        (world_sizes[0], np.finfo(np.float64).eps),
        va="bottom",
        fontsize=8,
        color="grey",
    )
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, 1e2)
    ax.set_xlabel("number of shards P")
    ax.set_ylabel("max |mean of shard grads − full grad|")
    ax.set_xticks(list(world_sizes))
    ax.legend(fontsize=8, loc="center right")
    ax.set_title("Only batch norm changes with the split")
    return figure


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


# -- non-deterministic reduction order --------------------------------------------------------


def sums_in_every_order(values: Sequence[float], dtype: type = np.float32) -> dict[tuple, float]:
    """The left-to-right sum of ``values`` in every order, computed in ``dtype``.

    Keys are the orders (tuples of indices), values the sums. Real numbers would give one sum;
    floating-point addition is not associative, so several distinct sums appear.
    """
    arr = np.asarray(values, dtype=dtype)
    sums = {}
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
    """Left: the largest gap between replicas (log scale); right: entries that differ in bits."""
    figure = Figure(figsize=(9, 3.2))
    left, right = figure.subplots(1, 2)
    for result in results:
        label = "same order on every rank" if result.deterministic else "each rank its own order"
        positive = np.where(result.divergence > 0, result.divergence, np.nan)
        if np.any(result.divergence > 0):
            left.plot(result.steps, positive, label=label)
        right.plot(result.steps, result.differing, label=label)
    left.set_yscale("log")
    left.set_xlabel("step")
    left.set_ylabel("max |θ_p − θ_0|")
    left.set_title("Replicas drift apart (zero is not drawn)")
    right.set_xlabel("step")
    right.set_ylabel("entries not bitwise equal")
    right.set_title("Bitwise identical or not")
    right.legend(fontsize=8)
    if left.get_lines():
        left.legend(fontsize=8)
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
        "steps": ipywidgets.IntSlider(value=steps, min=50, max=3000, step=50, description="steps"),
        "lr": ipywidgets.FloatSlider(value=0.5, min=0.05, max=1.0, step=0.05, description="lr"),
        "dtype": ipywidgets.Dropdown(
            options=[("float32", np.float32), ("float64", np.float64)],
            value=np.float32,
            description="dtype",
        ),
    }

    def compute(**v: object) -> tuple[DriftResult, DriftResult]:
        return tuple(replica_drift(deterministic=d, **v) for d in (True, False))

    return LiveWidget(controls, compute, _drift_table, plot_drift)
