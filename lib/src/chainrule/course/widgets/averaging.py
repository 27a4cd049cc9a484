"""Lesson 3's widget: averaging shard gradients against the full-batch gradient.

The model is the smallest possible: least squares with one parameter,

    ℓ(x, y; w) = ½(wx − y)²,      ∂ℓ/∂w = (wx − y)·x.

The batch ``B`` is split into shards ``B_1 … B_P`` (rank p holds ``B_p``) and rank p computes
the gradient of its local mean ``L_p = (1/|B_p|) Σ_{i∈B_p} ℓ_i``. Two numbers are compared:

- the full batch on one device: ``∇L = (1/|B|) Σ_{i∈B} ∇ℓ_i``;
- the plain mean of the local gradients (an all-reduce AVG): ``(1/P) Σ_p ∇L_p``, equal to ``∇L``
  when every shard has the same size, and in general not otherwise (which reduction is exact
  for any sizes is the first graded exercise).

:func:`averaging_result` computes both (each local gradient by the engine's backward pass,
checked against the closed form in the tests), :func:`averaging_result_from_ranks` takes them
from a run on ranks as the ranks returned them; :func:`averaging_markdown` renders the
syllabus's table from the values and :func:`build_averaging_widget` lets a reader
edit the examples, the number of ranks, the shard sizes and ``w``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure

from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.course.widgets.tables import html_table, markdown_table
from chainrule.engine.tensor import Tensor

Example = tuple[float, float]

WORKED_EXAMPLES: tuple[Example, ...] = ((1.0, 0.0), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0))
"""The syllabus's four examples ``(x, y)``; with ``w = 1`` and two ranks they give 1.5 and 7.0."""

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_PAIR = re.compile(rf"\(\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\)")


# -- the model ------------------------------------------------------------------------------------


def example_gradient(x: float, y: float, w: float) -> float:
    """``∂ℓ/∂w = (wx − y)·x`` for ``ℓ = ½(wx − y)²`` (the closed form)."""
    return (w * x - y) * x


def local_mean_gradient(examples: Sequence[Example], w: float) -> float:
    """``∇L_p = d/dw (1/|B_p|) Σ ½(wx − y)²``, computed by the engine's backward pass."""
    if not examples:
        raise ValueError("a rank needs at least one example to have a local mean")
    xs, ys = (np.array(column, dtype=np.float64) for column in zip(*examples, strict=True))
    weight = Tensor(w, requires_grad=True)
    loss = (0.5 * (weight * xs - ys) ** 2).mean()
    loss.backward()
    assert weight.grad is not None
    return float(weight.grad)


# -- shards -------------------------------------------------------------------------------------


def equal_shard_sizes(num_examples: int, num_ranks: int) -> list[int]:
    """Sizes as equal as possible (the first ``num_examples % num_ranks`` ranks get one more)."""
    if num_ranks < 1:
        raise ValueError(f"need at least one rank, got {num_ranks}")
    base, extra = divmod(num_examples, num_ranks)
    return [base + (1 if p < extra else 0) for p in range(num_ranks)]


def split_into_shards(
    examples: Sequence[Example], sizes: Sequence[int]
) -> list[tuple[Example, ...]]:
    """Consecutive shards of the given sizes (rank 0 takes the first ``sizes[0]`` examples)."""
    if any(size < 1 for size in sizes):
        raise ValueError(f"every rank needs at least one example, got shard sizes {list(sizes)}")
    if sum(sizes) != len(examples):
        raise ValueError(
            f"shard sizes {list(sizes)} add up to {sum(sizes)}, but there are "
            f"{len(examples)} examples"
        )
    bounds = np.cumsum([0, *sizes])
    return [tuple(examples[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def parse_examples(text: str) -> list[Example]:
    """``"(1,0), (2,1)"`` → ``[(1.0, 0.0), (2.0, 1.0)]``; anything else is a ``ValueError``."""
    pairs = [(float(x), float(y)) for x, y in _PAIR.findall(text)]
    leftover = _PAIR.sub("", text).replace(",", "").strip()
    if leftover or not pairs:
        raise ValueError(f"write the examples as (x, y) pairs, e.g. (1, 0), (2, 1); got {text!r}")
    return pairs


def parse_sizes(text: str) -> list[int]:
    """``"3, 1"`` → ``[3, 1]``."""
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(
            f"write the shard sizes as whole numbers, e.g. 2, 2; got {text!r}"
        ) from None


def format_examples(examples: Sequence[Example]) -> str:
    """The inverse of :func:`parse_examples`: ``"(1, 0), (2, 1)"``."""
    return ", ".join(f"({x:g}, {y:g})" for x, y in examples)


# -- the three reductions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """One rank's data and its local mean gradient ``∇L_p``."""

    rank: int
    examples: tuple[Example, ...]
    local_mean: float

    @property
    def size(self) -> int:
        return len(self.examples)


@dataclass(frozen=True)
class AveragingResult:
    """Each rank's local gradient, their plain mean and the full-batch gradient."""

    w: float
    shards: tuple[Shard, ...]
    mean_of_means: float  # (1/P) Σ_p ∇L_p
    full_batch: float  # (1/|B|) Σ_i ∇ℓ_i
    from_ranks: bool = False  # the local means and their mean are what the ranks returned

    @property
    def num_examples(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def equal_shards(self) -> bool:
        return len({s.size for s in self.shards}) == 1

    @property
    def mean_of_means_error(self) -> float:
        """How far the plain mean of local means is from the full-batch gradient."""
        return self.mean_of_means - self.full_batch


def averaging_result(
    examples: Sequence[Example], shard_sizes: Sequence[int] | None, w: float
) -> AveragingResult:
    """Split ``examples`` into consecutive shards of ``shard_sizes`` (``None``: two as equal as
    possible, as in the worked example), compute every ``∇L_p``, their mean and ``∇L``."""
    sizes = equal_shard_sizes(len(examples), 2) if shard_sizes is None else list(shard_sizes)
    shards = tuple(
        Shard(rank, part, local_mean_gradient(part, w))
        for rank, part in enumerate(split_into_shards(examples, sizes))
    )
    return AveragingResult(
        w=w,
        shards=shards,
        mean_of_means=float(np.mean([s.local_mean for s in shards])),
        full_batch=local_mean_gradient(examples, w),
    )


def averaging_result_from_ranks(
    shards: Sequence[Sequence[Example]],
    local_means: Sequence[float],
    averaged: Sequence[float],
    full_batch: float,
    w: float,
) -> AveragingResult:
    """The table's numbers as the ranks computed them: rank p held ``shards[p]``, computed
    ``local_means[p]`` and got ``averaged[p]`` back from the all-reduce; ``full_batch`` is the
    one-device gradient. Nothing is recomputed here.

    The all-reduce hands every rank the same bits, so the table has one row for the mean; a
    run whose ranks disagree is a ``ValueError``, not a table.
    """
    if not len(shards) == len(local_means) == len(averaged):
        raise ValueError(
            f"{len(shards)} shards, {len(local_means)} local means and {len(averaged)} averaged "
            "values: give one of each per rank"
        )
    if len({float(a) for a in averaged}) != 1:
        raise ValueError(f"the ranks hold different averages {list(averaged)}: not one mean")
    return AveragingResult(
        w=w,
        shards=tuple(
            Shard(rank, tuple(part), float(g))
            for rank, (part, g) in enumerate(zip(shards, local_means, strict=True))
        ),
        mean_of_means=float(averaged[0]),
        full_batch=float(full_batch),
        from_ranks=True,
    )


# -- rendering ----------------------------------------------------------------------------------


def _value(v: float) -> str:
    """A result as the syllabus prints it: ``1.5``, ``7.0``, ``4.25`` (at most 6 digits)."""
    v = round(float(v), 6) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{v:.1f}" if v == int(v) else f"{v:g}"


def _fraction(numerator: int, denominator: int, math: bool) -> str:
    f = Fraction(numerator, denominator)
    if f.denominator == 1:
        return str(f.numerator)
    return rf"\tfrac{{{f.numerator}}}{{{f.denominator}}}" if math else f"{f}"


def _term(x: float, y: float, w: float) -> str:
    """``(wx − y)(x)`` with both factors evaluated, as in the syllabus: ``(2)(3)``."""
    return f"({_value(w * x - y).removesuffix('.0')})({x:g})"


def _local_formula(shard: Shard, w: float, math: bool) -> str:
    terms = " + ".join(_term(x, y, w) for x, y in shard.examples)
    if shard.size == 1:
        text = (
            f"{terms}={_value(shard.local_mean)}"
            if math
            else f"{terms} = {_value(shard.local_mean)}"
        )
    elif math:
        text = rf"{_fraction(1, shard.size, True)}\big[{terms}\big]={_value(shard.local_mean)}"
    else:
        text = f"1/{shard.size}·[{terms}] = {_value(shard.local_mean)}"
    return f"${text}$" if math else text


_COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def _rows(result: AveragingResult, math: bool) -> tuple[list[str], list[list[str]]]:
    def wrap(text: str) -> str:
        return f"${text}$" if math else text

    header = ["Rank", "Examples (x, y)", "Local mean gradient ∇L_p"]
    rows = [
        [str(s.rank), format_examples(s.examples), _local_formula(s, result.w, math)]
        for s in result.shards
    ]
    p, n = len(result.shards), result.num_examples
    locals_ = " + ".join(_value(s.local_mean) for s in result.shards)
    mean_label = f"Mean of the {_COUNT_WORDS.get(p, p)} local gradients (all-reduce AVG)"
    if math:
        mean = wrap(rf"{_fraction(1, p, True)}({locals_})={_value(result.mean_of_means)}")
    else:
        mean = f"1/{p}·({locals_}) = {_value(result.mean_of_means)}"
    rows.append([mean_label, mean, ""])
    every = [example_gradient(x, y, result.w) for s in result.shards for x, y in s.examples]
    terms = " + ".join(_value(g).removesuffix(".0") for g in every)
    if math:
        full = wrap(rf"{_fraction(1, n, True)}\big[{terms}\big]={_value(result.full_batch)}")
    else:
        full = f"1/{n}·[{terms}] = {_value(result.full_batch)}"
    rows.append(["Full batch on one device", full, ""])
    return header, rows


def _verdict(result: AveragingResult) -> str:
    if not result.from_ranks:
        return _comparison(result)
    p = len(result.shards)
    ranks = "Both ranks hold" if p == 2 else f"All {_COUNT_WORDS.get(p, p)} ranks hold"
    if p == 1:
        ranks = "The one rank holds"
    held = f"{ranks} {_value(result.mean_of_means)} after the all-reduce, bit for bit. "
    return held + _comparison(result)


def _comparison(result: AveragingResult) -> str:
    full = _value(result.full_batch)
    if result.equal_shards:
        same = bool(np.isclose(result.mean_of_means, result.full_batch))
        relation = "equals" if same else "differs from"
        return (
            f"Equal shards: the mean of the local gradients, {_value(result.mean_of_means)}, "
            f"{relation} the full-batch gradient {full}."
        )
    sizes = ", ".join(str(s.size) for s in result.shards)
    if np.isclose(result.mean_of_means, result.full_batch):
        return (
            f"Unequal shards ({sizes}): here the plain mean of means happens to equal the "
            f"full-batch gradient {full}, by coincidence of these numbers."
        )
    return (
        f"Unequal shards ({sizes}): the plain mean of means, {_value(result.mean_of_means)}, is "
        f"off by {_value(result.mean_of_means_error)} from the full-batch gradient {full}."
    )


def averaging_markdown(result: AveragingResult) -> str:
    """The syllabus's table (with LaTeX formulas) and a verdict, from computed values."""
    header, rows = _rows(result, math=True)
    return markdown_table(header, rows) + "\n\n" + _verdict(result)


def averaging_html(result: AveragingResult) -> str:
    """The same table as plain-text HTML (the widget's view)."""
    header, rows = _rows(result, math=False)
    return html_table(header, rows) + f"<p>{_verdict(result)}</p>"


def plot_averaging(result: AveragingResult) -> Figure:
    """Each rank's local gradient as a bar (width ∝ shard size), with the full-batch gradient
    and the plain mean of the local gradients as horizontal lines."""
    figure = Figure(figsize=(7.2, 3.4))
    ax = figure.subplots()
    figure.subplots_adjust(left=0.11, right=0.7, bottom=0.2, top=0.88)
    n = result.num_examples
    left, centres, labels = 0.0, [], []
    for shard in result.shards:
        width = shard.size / n
        ax.bar(left + width / 2, shard.local_mean, width=width * 0.95, color="#9ecae1")
        centres.append(left + width / 2)
        labels.append(f"rank {shard.rank}\n|B_p|={shard.size}")
        left += width
    ax.axhline(result.full_batch, color="black", linewidth=2, label="full batch ∇L")
    ax.axhline(result.mean_of_means, color="#d62728", linestyle="--", label="mean of means")
    ax.axhline(0, color="grey", linewidth=0.6)
    values = [s.local_mean for s in result.shards] + [result.full_batch, 0.0]
    low, high = min(values), max(values)
    pad = 0.12 * (high - low) or 1.0
    ax.set_ylim(low - pad, high + pad)
    ax.set_xlim(0, 1)
    # Rank labels under the axis: they never meet the bars, the lines or the title.
    ax.set_xticks(centres, labels, fontsize=8 if len(labels) <= 4 else 7)
    ax.tick_params(axis="x", length=0)
    ax.set_ylabel("gradient dL/dw")
    ax.set_title(f"w = {result.w:g}: mean of means − ∇L = {_value(result.mean_of_means_error)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    return figure


def build_averaging_widget(
    examples: Sequence[Example] = WORKED_EXAMPLES,
    num_ranks: int = 2,
    shard_sizes: Sequence[int] | None = None,
    w: float = 1.0,
) -> LiveWidget:
    """Edit the examples, the number of ranks, the shard sizes and w; the table and the plot
    update.

    ``widget.controls``: ``examples`` (text of ``(x, y)`` pairs), ``num_ranks`` (slider, at most
    one rank per example; moving it resets the shard sizes to a split as equal as possible),
    ``shard_sizes`` (text such as ``"3, 1"``)
    and ``w`` (slider). ``widget.last_result`` is the :class:`AveragingResult`,
    ``widget.table.value`` its HTML table, ``widget.plot.value`` the PNG of
    :func:`plot_averaging`, ``widget.error`` the message when the inputs do not fit together.
    """
    sizes = list(shard_sizes) if shard_sizes else equal_shard_sizes(len(examples), num_ranks)
    examples_box = ipywidgets.Text(
        value=format_examples(examples), description="examples", continuous_update=False
    )
    count = len(examples)
    ranks = ipywidgets.IntSlider(
        value=min(num_ranks, count), min=1, max=min(8, count), description="ranks P"
    )
    sizes_box = ipywidgets.Text(
        value=", ".join(map(str, sizes)), description="shard sizes", continuous_update=False
    )
    weight = ipywidgets.FloatSlider(value=w, min=-2.0, max=3.0, step=0.25, description="w")

    def reset_sizes(_change: object = None) -> None:
        try:
            count = len(parse_examples(examples_box.value))
        except ValueError:
            return
        # Never more ranks than examples: every rank needs one example for its local mean.
        ranks.max = min(8, count)
        sizes_box.value = ", ".join(map(str, equal_shard_sizes(count, ranks.value)))

    # Registered before the LiveWidget's own observers, so the sizes already fit the new
    # number of ranks when the result is recomputed.
    ranks.observe(reset_sizes, names="value")
    examples_box.observe(reset_sizes, names="value")

    def compute(examples: str, num_ranks: int, shard_sizes: str, w: float) -> AveragingResult:
        sizes = parse_sizes(shard_sizes)
        if len(sizes) != num_ranks:
            raise ValueError(f"give {num_ranks} shard sizes, one per rank (got {len(sizes)})")
        return averaging_result(parse_examples(examples), sizes, w)

    controls = {
        "examples": examples_box,
        "num_ranks": ranks,
        "shard_sizes": sizes_box,
        "w": weight,
    }
    return LiveWidget(controls, compute, averaging_html, plot_averaging)
