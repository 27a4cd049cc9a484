"""Gradient accumulation, the averaging identity in time: the computations behind lesson 6.

Split a batch of equal-sized micro-batches ``B_1..B_k`` and let ``L_j`` be the mean loss on
``B_j``. The batch loss is ``L = (1/k) Σ_j L_j``, so by linearity

    ∇L = (1/k) Σ_j ∇L_j = Σ_j ∇(L_j / k):

run k backward passes of ``L_j/k`` into the same gradient buffer and it holds ``∇L``
(:func:`accumulation_check`).

Scaling the *loss* by 1/k (before backward) rather than the accumulated gradient (after the
k-th backward) matters in float16 with a *fixed* loss scale S chosen for one micro-batch: the
buffer of the second strategy holds ``S Σ_j ∇L_j``, k times the magnitude of the result, and
overflows first (:func:`fp16_accumulation`, :func:`build_fp16_widget`). Dividing first is the
scale S/k: k times more room before the overflow, k times less before the underflow. A
*dynamic* scaler erases the difference: it settles on a k times smaller S for the second
strategy, and then both buffers hold the same float16 numbers (:func:`dynamic_loss_scale`).

Data-parallel accumulation all-reduces once per step, not once per micro-batch, by skipping
the sync ("no sync") on the first k−1 backward passes; the gradient is the same either way
(:func:`accumulation_traffic`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from chainrule import dist
from chainrule.costs import comm_cost
from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.course.widgets.tables import html_table, number, power_of_two
from chainrule.engine import ops
from chainrule.engine.layers import MLP
from chainrule.engine.tensor import Tensor
from chainrule.parallel import data_parallel

FP16_MAX = float(np.finfo(np.float16).max)
"""The largest finite float16 number, 65504: anything larger rounds to inf."""

FP16_SMALLEST_NORMAL = float(np.finfo(np.float16).smallest_normal)
"""``2^-14``: below it float16 numbers are subnormal, with fewer significant bits, down to
``2^-24``, and smaller ones round to zero."""


# -- the identity -----------------------------------------------------------------------------


def make_regression(
    n: int = 32, widths: Sequence[int] = (3, 8, 1), seed: int = 0
) -> tuple[MLP, np.ndarray, np.ndarray]:
    """A small tanh MLP and a regression batch ``(x, y)`` with ``y = sin(x·a)`` plus noise."""
    rng = np.random.default_rng(seed)
    model = MLP(list(widths), rng)
    x = rng.standard_normal((n, widths[0]))
    y = np.sin(x @ rng.standard_normal((widths[0], widths[-1]))) + 0.1 * rng.standard_normal(
        (n, widths[-1])
    )
    return model, x, y


def mean_loss(model: Callable[[Tensor], Tensor], x: np.ndarray, y: np.ndarray) -> Tensor:
    """``L = mean_i ‖model(x_i) − y_i‖²/d``: the mean squared error over the examples."""
    return ops.mse_loss(model(Tensor(x)), y)


def gradient(model: MLP, loss: Tensor) -> list[np.ndarray]:
    """``∇L`` for every parameter of ``model`` (gradients cleared before, copied after)."""
    params = model.parameters()
    for p in params:
        p.grad = None
    loss.backward()
    return [np.array(p.grad) for p in params]


@dataclass(frozen=True)
class AccumulationCheck:
    """The three ways of getting the batch gradient, parameter by parameter.

    ``full_batch``: one backward of ``L`` on the whole batch. ``mean_of_micro``: k separate
    backward passes of ``L_j``, averaged afterwards. ``accumulated``: k backward passes of
    ``L_j/k`` into the same buffer without clearing it in between.
    """

    k: int
    full_batch: list[np.ndarray]
    mean_of_micro: list[np.ndarray]
    accumulated: list[np.ndarray]

    @property
    def max_error(self) -> float:
        """The largest difference of either micro-batch gradient from the full batch."""
        return max(
            float(np.abs(a - f).max())
            for f, m, c in zip(self.full_batch, self.mean_of_micro, self.accumulated, strict=True)
            for a in (m, c)
        )


def accumulation_check(model: MLP, x: np.ndarray, y: np.ndarray, k: int) -> AccumulationCheck:
    """Compare the full-batch gradient with k equal micro-batches, averaged and accumulated."""
    if len(x) % k:
        raise ValueError(f"a batch of {len(x)} does not split into {k} equal micro-batches")
    full = gradient(model, mean_loss(model, x, y))
    micro = [
        gradient(model, mean_loss(model, xj, yj))
        for xj, yj in zip(np.split(x, k), np.split(y, k), strict=True)
    ]
    mean_of_micro = [np.mean(gs, axis=0) for gs in zip(*micro, strict=True)]
    params = model.parameters()
    for p in params:
        p.grad = None
    for xj, yj in zip(np.split(x, k), np.split(y, k), strict=True):
        (mean_loss(model, xj, yj) / k).backward()  # the engine adds into .grad
    accumulated = [np.array(p.grad) for p in params]
    return AccumulationCheck(k, full, mean_of_micro, accumulated)


def micro_batch_gradients(model: MLP, x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """``∇L_j`` of each of k equal micro-batches, flattened: an array (k, n_params)."""
    return np.stack(
        [
            np.concatenate([g.ravel() for g in gradient(model, mean_loss(model, xj, yj))])
            for xj, yj in zip(np.split(x, k), np.split(y, k), strict=True)
        ]
    )


# -- float16 with a loss scale ----------------------------------------------------------------


@dataclass(frozen=True)
class Fp16Accumulation:
    """Accumulating float16 gradients of the loss-scaled micro-batch losses, two ways.

    With loss scale S, backward of ``S·L_j`` yields the float16 gradient ``S ∇L_j``.

    - *scale after*: add the k gradients ``fp16(S ∇L_j)`` into a float16 buffer, then divide
      by k·S. After micro-batch j the buffer holds ``S Σ_{i≤j} ∇L_i``: up to k times the size
      of the result.
    - *scale the loss first*: backward of ``S·L_j/k`` yields ``fp16(S ∇L_j / k)``; the buffer
      holds ``(S/k) Σ_{i≤j} ∇L_i``, never more than S times the largest micro-batch gradient;
      at the end divide by S.

    The second is the first with the scale S/k: k times more room below the overflow and k
    times less above the underflow. ``below_normal_after`` / ``below_normal_first`` count the
    nonzero entries of the k micro-batch gradients that a backward pass writes below float16's
    normal range (:data:`FP16_SMALLEST_NORMAL`: subnormal, losing bits, or zero).

    ``peak_after[j]`` / ``peak_first[j]`` are ``max |buffer|`` after micro-batch j (inf once
    it overflowed), ``result_after`` / ``result_first`` the final gradients (float32) and
    ``true_gradient`` the exact ``(1/k) Σ_j ∇L_j`` in float64.
    """

    k: int
    loss_scale: float
    peak_after: np.ndarray
    peak_first: np.ndarray
    result_after: np.ndarray
    result_first: np.ndarray
    true_gradient: np.ndarray
    below_normal_after: int = 0
    below_normal_first: int = 0

    @property
    def overflow_after(self) -> int | None:
        """The first micro-batch (1-based) after which the scale-after buffer is not finite."""
        bad = np.flatnonzero(~np.isfinite(self.peak_after))
        return int(bad[0]) + 1 if bad.size else None

    @property
    def overflow_first(self) -> int | None:
        """The same for the scale-the-loss-first buffer (None: it stayed finite)."""
        bad = np.flatnonzero(~np.isfinite(self.peak_first))
        return int(bad[0]) + 1 if bad.size else None

    @property
    def error_first(self) -> float:
        """``max |result_first − true|``: the float16 rounding error of the good strategy."""
        return float(np.abs(self.result_first - self.true_gradient).max())


def fp16_accumulation(micro_grads: np.ndarray, loss_scale: float) -> Fp16Accumulation:
    """Accumulate ``micro_grads`` (k, n: ``∇L_j`` in float64) in float16 both ways.

    Each micro-batch's scaled gradient is rounded to float16 (what a float16 backward pass
    produces) and added into a float16 buffer (float16 addition, inf on overflow).
    """
    grads = np.asarray(micro_grads, dtype=np.float64)
    k = len(grads)
    scale = float(loss_scale)
    after = np.zeros(grads.shape[1], dtype=np.float16)
    first = np.zeros(grads.shape[1], dtype=np.float16)
    peak_after, peak_first = np.empty(k), np.empty(k)
    below_after = below_first = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for j, g in enumerate(grads):
            micro_after = (scale * g).astype(np.float16)
            micro_first = (scale / k * g).astype(np.float16)
            below_after += _below_normal(g, micro_after)
            below_first += _below_normal(g, micro_first)
            after = after + micro_after
            first = first + micro_first
            peak_after[j] = np.abs(after).max()
            peak_first[j] = np.abs(first).max()
        result_after = after.astype(np.float32) / np.float32(k * scale)
        result_first = first.astype(np.float32) / np.float32(scale)
    return Fp16Accumulation(
        k,
        scale,
        peak_after,
        peak_first,
        result_after,
        result_first,
        grads.mean(axis=0),
        below_after,
        below_first,
    )


def _below_normal(exact: np.ndarray, in_fp16: np.ndarray) -> int:
    """Nonzero entries of ``exact`` whose float16 value is below the normal range (or 0)."""
    return int(np.count_nonzero((exact != 0) & (np.abs(in_fp16) < FP16_SMALLEST_NORMAL)))


def largest_safe_scale(micro_grads: np.ndarray) -> float:
    """The largest power of two S with ``S·|∇L_j| ≤ 65504`` for every single micro-batch.

    What a dynamic loss scaler settles on: as large as possible (small gradients keep their
    precision) while one backward pass stays finite.
    """
    peak = float(np.abs(np.asarray(micro_grads)).max())
    return float(2.0 ** np.floor(np.log2(FP16_MAX / peak)))


def dynamic_loss_scale(
    micro_grads: np.ndarray, scale_loss_first: bool, start: float = 2.0**24
) -> tuple[float, np.ndarray]:
    """What a dynamic loss scaler settles on for one accumulation step, and the buffer then.

    Starting from ``start``, the scale is halved while the float16 buffer of the chosen
    strategy (see :class:`Fp16Accumulation`) overflows anywhere in the k micro-batches.
    Returns the scale and the final float16 buffer (before unscaling).
    """
    scale = float(start)
    while scale >= 1.0:
        result = fp16_accumulation(micro_grads, scale)
        peaks = result.peak_first if scale_loss_first else result.peak_after
        if np.all(np.isfinite(peaks)):
            return scale, _buffer(micro_grads, scale, scale_loss_first)
        scale /= 2
    raise ValueError("no loss scale of at least 1 keeps the buffer finite")


def _buffer(micro_grads: np.ndarray, scale: float, scale_loss_first: bool) -> np.ndarray:
    """The float16 buffer after the k micro-batches of one strategy (see fp16_accumulation)."""
    grads = np.asarray(micro_grads, dtype=np.float64)
    factor = scale / len(grads) if scale_loss_first else scale
    buffer = np.zeros(grads.shape[1], dtype=np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        for g in grads:
            buffer = buffer + (factor * g).astype(np.float16)
    return buffer


def plot_fp16_accumulation(result: Fp16Accumulation) -> Figure:
    """``max |buffer|`` after each micro-batch for both strategies, with the float16 limit.

    The two strategies have different markers (filled circles, open squares) so that both
    show where they coincide (k = 1); an overflow is a cross above the limit, in the
    strategy's colour; the legend sits under the axes, clear of every line.
    """
    figure = Figure(figsize=(7.0, 3.9))
    ax = figure.subplots()
    figure.subplots_adjust(left=0.11, right=0.97, top=0.9, bottom=0.33)
    steps = np.arange(1, result.k + 1)
    styles: tuple[tuple[np.ndarray, str, dict[str, Any]], ...] = (
        (result.peak_after, "scale the gradient after", dict(marker="o", markersize=5)),
        (
            result.peak_first,
            "scale each loss by 1/k first",
            dict(marker="s", markersize=9, markerfacecolor="none", markeredgewidth=1.5),
        ),
    )
    overflowed = False
    for height, (peaks, label, style) in zip((3.0, 6.0), styles, strict=True):
        finite = np.isfinite(peaks)
        (line,) = ax.plot(steps[finite], peaks[finite], label=label, linewidth=1.2, **style)
        if not finite.all():  # an overflow: a cross in the strategy's colour, above the limit
            overflowed = True
            ax.plot(
                steps[~finite],
                [FP16_MAX * height] * int((~finite).sum()),
                "x",
                color=line.get_color(),
                markersize=8,
                markeredgewidth=2,
            )
    if overflowed:
        ax.plot([], [], "x", color="grey", markeredgewidth=2, label="overflow to inf (×)")
    ax.axhline(
        FP16_MAX,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"largest float16, {number(FP16_MAX)}",
    )
    ax.set_yscale("log")
    finite_peaks = np.concatenate(
        [p[np.isfinite(p)] for p in (result.peak_after, result.peak_first)]
    )
    low = min(float(finite_peaks.min()) if finite_peaks.size else FP16_MAX, FP16_MAX) / 4
    ax.set_ylim(max(low, 1e-8), FP16_MAX * 20)
    ax.set_xlim(0.5, result.k + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("micro-batch j")
    ax.set_ylabel("max |gradient buffer|")
    ax.set_title(f"k = {result.k}, loss scale S = {power_of_two(result.loss_scale)}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return figure


def _largest_finite(peaks: np.ndarray) -> str:
    finite = peaks[np.isfinite(peaks)]
    return number(float(finite.max())) if finite.size else "none"


def _fp16_table(result: Fp16Accumulation) -> str:
    def when(step: int | None) -> str:
        return "never" if step is None else f"after micro-batch {step}"

    entries = result.k * result.true_gradient.size
    rows = [
        [
            "scale the gradient after",
            _largest_finite(result.peak_after),
            when(result.overflow_after),
            f"{result.below_normal_after} of {entries}",
        ],
        [
            "scale each loss by 1/k first",
            _largest_finite(result.peak_first),
            when(result.overflow_first),
            f"{result.below_normal_first} of {entries}",
        ],
    ]
    header = [
        "strategy",
        "largest finite buffer value",
        "overflow to inf",
        f"micro-batch entries below {power_of_two(FP16_SMALLEST_NORMAL)} (subnormal or 0)",
    ]
    return (
        f"<p>k = {result.k} micro-batches, fixed loss scale S = "
        f"{power_of_two(result.loss_scale)}</p>" + html_table(header, rows)
    )


def build_fp16_widget(
    micro_grads: np.ndarray | None = None, k: int = 8, log2_scale: int | None = None
) -> LiveWidget:
    """Controls ``k`` (micro-batches) and ``log2_scale`` (S = 2^log2_scale).

    ``micro_grads`` is a pool of micro-batch gradients (rows, at least one); the first k are
    accumulated. By default they come from :func:`make_regression` cut into 32 micro-batches,
    and S starts at :func:`largest_safe_scale` of the pool. ``last_result`` is the
    :class:`Fp16Accumulation`.
    """
    if micro_grads is None:
        model, x, y = make_regression(n=128)
        micro_grads = micro_batch_gradients(model, x, y, 32)
    pool = np.asarray(micro_grads)
    if log2_scale is None:
        log2_scale = int(np.log2(largest_safe_scale(pool)))
    controls = {
        "k": ipywidgets.IntSlider(
            value=min(k, len(pool)), min=1, max=len(pool), description="micro-batches k"
        ),
        "log2_scale": ipywidgets.IntSlider(
            value=log2_scale, min=0, max=24, description="loss scale log₂ S"
        ),
    }

    def compute(k: int, log2_scale: int) -> Fp16Accumulation:
        return fp16_accumulation(pool[:k], 2.0**log2_scale)

    return LiveWidget(controls, compute, _fp16_table, plot_fp16_accumulation)


# -- no sync ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncTraffic:
    """One data-parallel accumulation step: the collectives it made and the gradients.

    ``all_reduces``: all-reduces recorded in ``trace`` (a :class:`chainrule.dist.Trace`);
    ``payload_bytes``: the bytes of the gradients they reduce, per rank (what each rank hands
    to the collective, not what it sends: see :attr:`ring_bytes_sent`); ``grads[p]``: rank p's
    averaged gradients.
    """

    world_size: int
    k: int
    no_sync: bool
    all_reduces: int
    payload_bytes: int
    grads: list[list[np.ndarray]]
    trace: dist.Trace

    @property
    def ring_bytes_sent(self) -> float:
        """The bytes each rank sends for these all-reduces on a ring: ``2(P−1)/P`` of the
        payload (a reduce-scatter, then an all-gather; :mod:`chainrule.costs.comm_cost`)."""
        return sum(comm_cost.event_bytes(e) for e in self.trace if e.op == "all_reduce")


def _accumulation_step(k: int, no_sync: bool, seed: int) -> list[np.ndarray]:
    """SPMD: one step of accumulation over k micro-batches of this rank's shard."""
    model, x, y = make_regression(n=8 * k * dist.world_size(), seed=seed)
    shard = np.array_split(np.arange(len(x)), dist.world_size())[dist.rank()]
    micro = list(zip(np.split(x[shard], k), np.split(y[shard], k), strict=True))
    data_parallel.accumulate_gradients(
        model.parameters(), micro, lambda b: mean_loss(model, *b), no_sync=no_sync
    )
    return [np.array(p.grad) for p in model.parameters()]


def accumulation_traffic(world_size: int, k: int, no_sync: bool, seed: int = 0) -> SyncTraffic:
    """Run one accumulation step on the simulated world and count its all-reduces."""
    trace = dist.Trace()
    grads = dist.run(_accumulation_step, world_size, args=(k, no_sync, seed), trace=trace)
    return SyncTraffic(
        world_size,
        k,
        no_sync,
        trace.count("all_reduce"),
        trace.total_bytes("all_reduce"),
        grads,
        trace,
    )


def full_batch_gradient(world_size: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """The same step's gradient on one device: the whole batch, one backward."""
    model, x, y = make_regression(n=8 * k * world_size, seed=seed)
    return gradient(model, mean_loss(model, x, y))
