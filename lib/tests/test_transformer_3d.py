"""The capstone's transformer on a dp × tp × pp grid: the grid's groups, the model cut into
stages, training equal to one process in its parameters (float64 on the simulated world,
float32 on gloo within float32's rounding) and the bytes of each axis read from a trace."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from chainrule import dist
from chainrule.costs import comm_cost
from chainrule.parallel import transformer as tf
from chainrule.parallel import transformer_3d as t3

TEXT = "reverse mode is a chain of vector-Jacobian products; fan-out becomes a sum. " * 4


def _training(dtype: str = "float64", steps: int = 3, batch: int = 8, layers: int = 2):
    chars = tf.vocabulary(TEXT)
    config = tf.Config(
        vocab=len(chars), context=8, width=16, heads=4, layers=layers, hidden=16, dtype=dtype
    )
    windows = tf.batches(tf.encode(TEXT, chars), steps, batch, config.context, seed=3)
    return tf.Training(config, tf.init_weights(config, seed=2), windows, lr=0.2)


def test_the_groups_of_a_2x2x2_grid():
    groups = t3.grid_groups(2, 2, 2)
    assert groups == {
        "data": [(0, 2), (1, 3), (4, 6), (5, 7)],
        "tensor": [(0, 1), (2, 3), (4, 5), (6, 7)],
        "pipeline": [(0, 4), (1, 5), (2, 6), (3, 7)],
    }


@pytest.mark.parametrize(("dp", "tp", "pp"), [(2, 2, 2), (1, 2, 3), (3, 1, 2), (2, 3, 1)])
def test_each_axis_partitions_the_ranks_and_coordinates_invert_the_numbering(dp, tp, pp):
    size = dp * tp * pp
    for axis, length in (("data", dp), ("tensor", tp), ("pipeline", pp)):
        groups = t3.grid_groups(dp, tp, pp)[axis]
        assert sorted(r for g in groups for r in g) == list(range(size))
        assert {len(g) for g in groups} == {length}
    for rank in range(size):
        s, d, t = t3.coordinates(rank, dp, tp)
        assert t3.grid_rank(s, d, t, dp, tp) == rank and 0 <= s < pp
    pipeline = t3.grid_groups(dp, tp, pp)["pipeline"]
    assert all([t3.coordinates(r, dp, tp)[0] for r in g] == list(range(pp)) for g in pipeline)


def _place():
    g = t3.grid_3d(2, 2, 2)
    return dist.rank(), g.stage, g.dp_rank, g.tp_rank, g.dp_group, g.tp_group, g.pp_group


def test_every_rank_finds_its_three_groups():
    groups = t3.grid_groups(2, 2, 2)
    for rank, s, d, t, dp_group, tp_group, pp_group in dist.run(_place, 8):
        assert (s, d, t) == t3.coordinates(rank, 2, 2)
        assert dp_group.ranks in groups["data"] and rank in dp_group.ranks
        assert tp_group.ranks in groups["tensor"] and rank in tp_group.ranks
        assert pp_group.ranks in groups["pipeline"] and pp_group.ranks[s] == rank
    with pytest.raises(dist.RankError, match=r"a 2 × 2 × 2 grid needs 8 ranks, the world has 4"):
        dist.run(t3.grid_3d, 4, args=(2, 2, 2))


def test_the_stages_hold_the_model_once():
    t = _training(layers=4)
    config, pp, tp = t.config, 2, 2
    assert [list(t3.stage_blocks(config, s, pp)) for s in range(pp)] == [[0, 1], [2, 3]]
    parts = [
        t3.stage_weights(t.weights, config, s, pp, r, tp) for s in range(pp) for r in range(tp)
    ]
    whole = t3.whole_model(parts, 1, tp, pp)  # parts[r]: rank r = s·2 + t of a 1 × 2 × 2 grid
    assert whole.keys() == t.weights.keys()
    assert all(np.array_equal(whole[n], w) for n, w in t.weights.items())
    assert t3.stage_of("embed", config, pp) == 0 and t3.stage_of("head", config, pp) == 1
    assert t3.stage_of("2.wq", config, pp) == 1 and t3.stage_of("1.w2", config, pp) == 0
    with pytest.raises(ValueError, match="4 blocks do not cut into 3 equal stages"):
        t3.stage_blocks(config, 0, 3)


def test_parameter_counts_without_the_arrays():
    t = _training(layers=4)
    shapes = t3.parameter_shapes(t.config)
    assert shapes == {n: w.shape for n, w in t.weights.items()}
    total = sum(w.size for w in t.weights.values())
    assert sum(t3.parameters_per_rank(t.config, 1, 2)) == total
    for tp, pp in ((2, 2), (4, 1), (2, 4)):
        counts = t3.parameters_per_rank(t.config, tp, pp)
        expected = [
            sum(w.size for w in t3.stage_weights(t.weights, t.config, s, pp, 0, tp).values())
            for s in range(pp)
        ]
        assert counts == expected


def _parameter_gap(runs, dp, tp, pp, reference):
    whole = t3.whole_model([r.weights for r in runs], dp, tp, pp)
    assert whole.keys() == reference.keys()
    return max(float(np.abs(whole[n] - w).max()) for n, w in reference.items())


@pytest.mark.parametrize(
    ("dp", "tp", "pp", "m", "schedule"),
    [(2, 2, 2, 2, "1f1b"), (1, 1, 2, 4, "1f1b"), (2, 1, 2, 2, "gpipe"), (1, 2, 2, 1, "1f1b")],
)
def test_training_on_the_3d_grid_equals_one_process_in_float64(dp, tp, pp, m, schedule):
    t = _training()
    losses, reference = tf.trained_one_process(t)
    runs = dist.run(t3.train_on_3d_grid, dp * tp * pp, args=(t, dp, tp, pp, m, schedule))
    assert _parameter_gap(runs, dp, tp, pp, reference) < 1e-12
    assert t3.replicas_agree([r.weights for r in runs], dp, tp)
    stages = [t3.coordinates(rank, dp, tp)[0] for rank in range(len(runs))]
    last = [r for r, s in zip(runs, stages, strict=True) if s == pp - 1]
    assert all(r.losses == last[0].losses for r in last)
    assert all(r.losses == [] for r, s in zip(runs, stages, strict=True) if s < pp - 1)
    np.testing.assert_allclose(last[0].losses, losses, rtol=0, atol=1e-12)
    expected = {"1f1b": [min(pp - 1, m)], "gpipe": [m]}[schedule][0]
    assert runs[0].order[:expected] == [f"F{i}" for i in range(expected)]


def test_a_micro_batch_loss_not_divided_by_m_is_far_from_one_process():
    """The comparison tells a wrong program: gradients summed over the m micro-batches instead
    of averaged are, with SGD and momentum, the right program with m times the step."""
    t = _training()
    _, reference = tf.trained_one_process(t)
    wrong = dataclasses.replace(t, lr=2 * t.lr)
    runs = dist.run(t3.train_on_3d_grid, 4, args=(wrong, 1, 2, 2, 2))
    assert _parameter_gap(runs, 1, 2, 2, reference) > 1e-3


def test_the_bytes_of_each_axis_from_the_trace():
    t, dp, tp, pp, m = _training(steps=1), 2, 2, 2, 2
    trace = dist.Trace()
    dist.run(t3.train_on_3d_grid, 8, args=(t, dp, tp, pp, m), trace=trace)
    sent = comm_cost.bytes_by_axis(trace, t3.grid_groups(dp, tp, pp))
    c, rows = t.config, len(t.windows[0]) // dp
    stream = rows * c.context * c.width * 8  # one replica's residual stream, float64
    for rank, axes in enumerate(sent):
        s, _, _ = t3.coordinates(rank, dp, tp)
        blocks = len(t3.stage_blocks(c, s, pp))
        # 4 all-reduces per block and micro-batch; the m micro-batches make up the stream
        assert axes["tensor"] == 4 * blocks * 2 * (tp - 1) / tp * stream
        links = (s > 0) + (s < pp - 1)  # activations forward, gradients back
        assert axes["pipeline"] == links * stream
        gradients = t3.parameters_per_rank(c, tp, pp)[s] * 8 + (8 if s == pp - 1 else 0)
        assert axes["data"] == 2 * (dp - 1) / dp * gradients
    assert trace.count("send") == dp * tp * (pp - 1) * m * 2


@pytest.mark.skipif(not dist.is_available("gloo"), reason="no gloo")
def test_training_on_four_gloo_processes_in_float32_is_within_float32_rounding():
    """2 × 1 × 2 on gloo, float32: as far from the float64 parameters as one float32 process
    lands (its distance, four times over: float32 rounds each sum to 2^−24 of its size, and the
    processes add the same terms in another order)."""
    t64, t32 = _training(), _training("float32")
    _, one64 = tf.trained_one_process(t64)
    _, one32 = tf.trained_one_process(t32)
    rounding = max(float(np.abs(one32[n] - w).max()) for n, w in one64.items())
    assert 0 < rounding < 1e-4
    runs = dist.run(t3.train_on_3d_grid, 4, backend="gloo", args=(t32, 2, 1, 2, 2), timeout=120)
    assert runs[0].weights["embed"].dtype == np.float32
    assert 0 < _parameter_gap(runs, 2, 1, 2, one64) <= 4 * rounding
    assert t3.replicas_agree([r.weights for r in runs], 2, 1)
