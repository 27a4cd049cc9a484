"""Lesson 15's grid widget: each grid of 4 ranks runs one traced step equal to one process, and
the bytes each rank sends in its row and column are the ring model's."""

import numpy as np
import pytest
from chainrule.course.widgets import grid_traffic as gw
from chainrule.parallel import transformer as tf

TEXT = "replication forward means summation backward. " * 6
CHARS = tf.vocabulary(TEXT)
IDS = tf.encode(TEXT, CHARS)
CONFIG = tf.Config(vocab=len(CHARS), context=8, width=16, heads=4, layers=1, hidden=16)
WEIGHTS = tf.init_weights(CONFIG, seed=0)


@pytest.mark.parametrize(("dp", "tp"), list(gw.LAYOUTS.values()))
def test_each_grid_sends_the_ring_models_bytes(dp, tp):
    step = gw.grid_step(CONFIG, WEIGHTS, IDS, dp, tp, sequences=8)
    assert step.gap < 1e-12
    activations = 8 // dp * CONFIG.context * CONFIG.width * 8
    gradients = sum(
        w.size // tp if tf.shard_axis(n) is not None else w.size for n, w in WEIGHTS.items()
    )
    ring = lambda n, p: 2 * (p - 1) / p * n  # noqa: E731
    for r in range(4):
        assert step.row_bytes[r] == 4 * CONFIG.layers * ring(activations, tp)
        assert step.column_bytes[r] == ring(gradients * 8, dp) + ring(8, dp)
    # a group of one rank moves nothing and is not counted: f, f̄ in rows of tp > 1 ranks,
    # the gradients' and the loss's all-reduce in columns of dp > 1 ranks
    assert step.collectives == [4 * CONFIG.layers * (tp > 1) + 2 * (dp > 1)] * 4
    table = gw.grid_table(step)
    assert ("a row is one rank" in table) == (tp == 1)
    assert ("a column is one rank" in table) == (dp == 1)
    assert np.isfinite(step.loss)


def test_impossible_splits_are_named():
    with pytest.raises(ValueError, match="do not split into 4 equal parts"):
        gw.grid_step(CONFIG, WEIGHTS, IDS, 4, 1, sequences=6)
    with pytest.raises(ValueError, match="heads do not split"):
        gw.grid_step(tf.Config(vocab=len(CHARS), heads=3, width=12), WEIGHTS, IDS, 1, 4, 4)


def test_widget_at_both_ends(sweep):
    widget = gw.build_grid_traffic_widget(CONFIG, WEIGHTS, IDS)
    for name, value in sweep(widget):
        step = widget.last_result
        assert (step.dp, step.tp) == gw.LAYOUTS[widget.controls["layout"].value], (name, value)
        assert step.sequences == widget.controls["sequences"].value
        assert step.gap < 1e-12 and "from one process" in widget.table.value
