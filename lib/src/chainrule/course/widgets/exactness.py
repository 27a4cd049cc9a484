"""Where the exactness of data parallelism quietly breaks, in the loss and in the data
(lesson 4).

The proof that averaging shard gradients gives the full-batch gradient rests on three
assumptions (:data:`PROOF_ASSUMPTIONS`) and on linearity: the mean commutes with the sums of
differentiation, and with nothing that is not linear. Each row of :data:`EXACTNESS_TABLE` (the
syllabus's table, in its words) is a way real training breaks one of the assumptions, except
global gradient clipping, which breaks none: the clip is a nonlinear function of the whole
gradient, applied after the proof is done (:data:`BEYOND_LINEARITY`). Lesson 4 treats the first
two rows (uneven token counts, batch normalization: :func:`normalize_by_shard`); lesson 5 the
last three (:mod:`chainrule.course.widgets.replicas`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chainrule.course.widgets.tables import markdown_table
from chainrule.engine import ops
from chainrule.engine.tensor import Tensor

# -- the three assumptions and the table ------------------------------------------------------

PROOF_ASSUMPTIONS: tuple[str, ...] = (
    "the loss is a sum over examples",
    "the shards are equal in weight",
    "every rank starts from the same θ",
)

BEYOND_LINEARITY = (
    "none: the clip is a nonlinear function of the whole gradient, where the proof's "
    "linearity does not reach"
)
"""What global gradient clipping breaks: no assumption. The proof shows that the mean of the
local gradients is ∇L; clipping is applied to a gradient, and clip(mean) ≠ mean(clip): it must
see the whole averaged gradient (plain data parallelism: after the all-reduce) or the global
norm (a sharded gradient: an all-reduce of the squared norms)."""


@dataclass(frozen=True)
class ExactnessRow:
    """One row of the syllabus's table: a situation, what goes wrong, and the fix.

    ``assumption`` is the index in :data:`PROOF_ASSUMPTIONS` of the assumption the situation
    breaks, or ``None`` where it breaks none of them and lies beyond the proof's linearity
    (global gradient clipping, :data:`BEYOND_LINEARITY`).
    """

    situation: str
    what_goes_wrong: str
    fix: str
    assumption: int | None


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
        None,
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


def exactness_table_markdown(with_assumption: bool = False, rows: slice | None = None) -> str:
    """:data:`EXACTNESS_TABLE` (or the rows ``rows`` of it) as Markdown (Situation | What goes
    wrong | Fix).

    With ``with_assumption=True`` a fourth column names the assumption each row breaks.
    """
    header = ["Situation", "What goes wrong", "Fix"]
    chosen = EXACTNESS_TABLE[rows or slice(None)]
    cells = [[r.situation, r.what_goes_wrong, r.fix] for r in chosen]
    if with_assumption:
        header.append("Assumption broken")
        for row, r in zip(cells, chosen, strict=True):
            row.append(
                BEYOND_LINEARITY if r.assumption is None else PROOF_ASSUMPTIONS[r.assumption]
            )
    return markdown_table(header, cells)


# -- batch norm versus batch-independent norms -----------------------------------------------

NORMS: dict[str, Callable[[Tensor], Tensor]] = {
    "batch_norm": ops.batch_norm,
    "layer_norm": ops.layer_norm,
    "rms_norm": ops.rms_norm,
}


def normalize_by_shard(norm: str, h: np.ndarray, world_size: int) -> np.ndarray:
    """``norm`` applied to each of ``world_size`` equal shards of ``h`` on its own, re-joined.

    The forward pass a data-parallel run computes: for batch norm the output for one example
    changes with the split; for LayerNorm and RMSNorm it does not.
    """
    return np.concatenate([NORMS[norm](Tensor(s)).data for s in np.split(h, world_size)])
