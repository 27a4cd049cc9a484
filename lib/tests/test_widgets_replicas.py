"""Lesson 5's computations: sharded clipping, reduction order, replica drift, the widget."""

import numpy as np
import pytest
import torch
from chainrule.course.widgets import replicas as rp
from chainrule.course.widgets.live_widget import smallest_text_px

# -- global clipping --------------------------------------------------------------------------


def test_global_clipping_equals_torch_clipping_of_the_whole_gradient():
    rng = np.random.default_rng(3)
    shards = [rng.standard_normal(5) * s for s in (1.0, 4.0, 0.2)]
    result = rp.clip_sharded(shards, max_norm=1.0)
    whole = torch.tensor(np.concatenate(shards), requires_grad=True)
    whole.grad = whole.detach().clone()
    total = torch.nn.utils.clip_grad_norm_([whole], max_norm=1.0)
    assert result.global_norm == pytest.approx(float(total))
    np.testing.assert_allclose(np.concatenate(result.globally_clipped), whole.grad.numpy())
    assert np.linalg.norm(np.concatenate(result.globally_clipped)) == pytest.approx(1.0, rel=1e-5)
    # Each rank alone picks a different coefficient, and the direction changes.
    assert len(set(result.local_coefficients.round(12))) == 3
    local = np.concatenate(result.locally_clipped)
    cosine = local @ whole.grad.numpy() / (np.linalg.norm(local) * np.linalg.norm(whole.grad))
    assert cosine < 0.99


def test_clip_does_nothing_below_the_threshold():
    shards = [np.array([0.1, 0.2]), np.array([0.05])]
    result = rp.clip_sharded(shards, max_norm=10.0)
    assert result.global_coefficient == 1.0
    np.testing.assert_array_equal(np.concatenate(result.globally_clipped), np.concatenate(shards))


# -- reduction order --------------------------------------------------------------------------


def test_float32_sums_depend_on_the_order():
    sums = rp.sums_in_every_order([0.1, 0.2, 0.3, 0.7], dtype=np.float32)
    assert len(sums) == 24
    assert len(set(sums.values())) > 1
    a, b, c, d = (np.float32(v) for v in (0.1, 0.2, 0.3, 0.7))
    assert sums[(0, 1, 2, 3)] == float(((a + b) + c) + d)
    assert sums[(3, 2, 1, 0)] == float(((d + c) + b) + a)
    assert max(sums.values()) - min(sums.values()) < 1e-6


def test_integer_valued_sums_do_not_depend_on_the_order():
    sums = rp.sums_in_every_order([1.0, 2.0, 3.0, 4.0], dtype=np.float64)
    assert set(sums.values()) == {10.0}


def test_drift_problem_gradients_match_torch():
    problem = rp.DriftProblem.make(world_size=2, dtype=np.float64)
    loss, g1, g2 = problem.loss_and_grads(problem.x, problem.y, problem.w1, problem.w2)
    w1 = torch.tensor(problem.w1, requires_grad=True)
    w2 = torch.tensor(problem.w2, requires_grad=True)
    pred = torch.tanh(torch.tensor(problem.x) @ w1) @ w2
    ref = 0.5 * ((pred - torch.tensor(problem.y)) ** 2).mean()
    ref.backward()
    assert loss == pytest.approx(ref.item())
    np.testing.assert_allclose(g1, w1.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(g2, w2.grad.numpy(), atol=1e-12)


def test_deterministic_reduction_keeps_replicas_bitwise_identical():
    result = rp.replica_drift(world_size=4, steps=300, deterministic=True)
    assert result.first_divergent_step is None
    assert not result.divergence.any() and not result.differing.any()
    for p in result.params[1:]:
        assert np.array_equal(p, result.params[0])


def test_deterministic_replicas_follow_full_batch_gradient_descent():
    steps, world = 200, 4
    result = rp.replica_drift(world, steps, deterministic=True, dtype=np.float64)
    problem = rp.DriftProblem.make(world, dtype=np.float64)
    w1, w2 = problem.w1.copy(), problem.w2.copy()
    for _ in range(steps):
        _, g1, g2 = problem.loss_and_grads(problem.x, problem.y, w1, w2)
        w1, w2 = w1 - 0.5 * g1, w2 - 0.5 * g2
    single = np.concatenate([w1.ravel(), w2.ravel()])
    np.testing.assert_allclose(result.params[0], single, atol=1e-10)
    assert result.losses[-1] < result.losses[0]


def test_per_rank_reduction_order_makes_replicas_drift_apart():
    result = rp.replica_drift(world_size=4, steps=1500, deterministic=False)
    assert result.first_divergent_step is not None
    assert result.differing[-1] > 0
    assert result.divergence[-1] > 10 * result.divergence[0] > 0


def test_two_ranks_cannot_drift_because_addition_commutes():
    result = rp.replica_drift(world_size=2, steps=200, deterministic=False)
    assert result.first_divergent_step is None


def test_drift_needs_two_ranks():
    with pytest.raises(ValueError):
        rp.replica_drift(world_size=1)


def test_drift_widget_recomputes_when_controls_change():
    widget = rp.build_drift_widget(world_size=2, steps=100)
    deterministic, per_rank = widget.last_result
    assert deterministic.deterministic and not per_rank.deterministic
    assert len(per_rank.divergence) == 100
    widget.controls["steps"].value = 150
    widget.controls["world_size"].value = 3
    deterministic, per_rank = widget.last_result
    assert len(per_rank.divergence) == 150 and len(per_rank.params) == 3
    assert "never" in widget.table.value
    assert bytes(widget.plot.value).startswith(b"\x89PNG")


def test_clip_picture_is_readable():
    clip = rp.clip_sharded([np.ones(3), 3 * np.ones(3)], 1.0)
    assert smallest_text_px(rp.plot_clip_coefficients(clip)) >= 9


def test_drift_widget_at_the_ends_of_its_controls(sweep):
    widget = rp.build_drift_widget(world_size=2, steps=100)
    for name, value in sweep(widget):
        deterministic, per_rank = widget.last_result
        assert deterministic.first_divergent_step is None, (name, value)


@pytest.mark.parametrize("world_size", [2, 3])
def test_drift_picture_draws_something_on_both_axes_and_never_a_negative_count(world_size):
    results = tuple(rp.replica_drift(world_size, steps=200, deterministic=d) for d in (True, False))
    figure = rp.plot_drift(results)
    gap, count = figure.axes
    assert count.get_ylim()[0] == 0 and count.get_ylim()[1] >= 1
    assert all(t == int(t) for t in count.get_yticks())
    if world_size == 2:  # nobody drifts: a linear axis with the zero lines and the reason
        assert gap.get_yscale() == "linear" and gap.get_ylim() == (0, 1)
        assert [list(line.get_ydata()) for line in gap.get_lines()] == [[0.0] * 200] * 2
        assert "bitwise identical" in gap.texts[0].get_text()
    else:  # the drift on a log axis; the reduction that never drifts is named in the legend
        assert gap.get_yscale() == "log"
        labels = [t.get_text() for t in gap.get_legend().get_texts()]
        assert labels == ["same order on every rank: 0 at every step", "each rank its own order"]
    assert smallest_text_px(figure) >= 9
