"""Lesson 4's computations: the syllabus's table, and normalisation under a split."""

import numpy as np
import torch
from chainrule.course.widgets import exactness as ex


def test_table_has_the_five_rows_and_three_columns():
    md = ex.exactness_table_markdown()
    lines = md.splitlines()
    assert lines[0] == "| Situation | What goes wrong | Fix |"
    assert len(lines) == 2 + 5
    for row in ex.EXACTNESS_TABLE:
        assert row.situation in md and row.fix in md
        assert row.assumption is None or 0 <= row.assumption < len(ex.PROOF_ASSUMPTIONS)
    with_assumption = ex.exactness_table_markdown(with_assumption=True)
    assert with_assumption.splitlines()[0].endswith("| Assumption broken |")
    assert ex.PROOF_ASSUMPTIONS[1] in with_assumption


def test_clipping_breaks_no_assumption_but_lies_beyond_linearity():
    broken = {r.situation: r.assumption for r in ex.EXACTNESS_TABLE}
    assert broken["Global gradient clipping"] is None
    assert broken["Uneven token counts per rank"] == 1 and broken["Batch normalization"] == 0
    rows = ex.exactness_table_markdown(with_assumption=True).splitlines()
    clipping = next(line for line in rows if line.startswith("| Global gradient clipping"))
    assert clipping.endswith(f"| {ex.BEYOND_LINEARITY} |") and "nonlinear" in clipping
    # The reason, in numbers: clipping the shards' gradients and averaging is not clipping
    # the average, although the average of the gradients is the full-batch gradient.
    rng = np.random.default_rng(0)
    local = [rng.standard_normal(4) * s for s in (0.3, 3.0)]

    def clipped(g, max_norm=1.0):
        return g * min(1.0, max_norm / np.linalg.norm(g))

    mean_of_clipped = np.mean([clipped(g) for g in local], axis=0)
    assert np.abs(mean_of_clipped - clipped(np.mean(local, axis=0))).max() > 0.1


def test_the_table_can_be_cut_into_the_two_lessons():
    first = ex.exactness_table_markdown(rows=slice(0, 2)).splitlines()
    assert len(first) == 2 + 2 and "Uneven token counts" in first[2]
    assert "Batch normalization" in first[3]
    assert len(ex.exactness_table_markdown(rows=slice(2, None)).splitlines()) == 2 + 3


def test_normalize_by_shard_changes_the_function_only_for_batch_norm():
    h = np.random.default_rng(2).standard_normal((8, 5))
    for norm in ("layer_norm", "rms_norm"):
        quarters = ex.normalize_by_shard(norm, h, 4)
        np.testing.assert_allclose(quarters, ex.normalize_by_shard(norm, h, 1))
    whole = ex.normalize_by_shard("batch_norm", h, 1)
    halves = ex.normalize_by_shard("batch_norm", h, 2)
    assert np.abs(whole - halves).max() > 1e-2
    reference = torch.nn.functional.batch_norm(torch.tensor(h[4:]), None, None, training=True)
    np.testing.assert_allclose(halves[4:], reference.numpy(), atol=1e-12)
