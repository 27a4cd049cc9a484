"""Lesson 4's computations: token weights, norms under splits, clipping, reduction order, drift."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from chainrule.widgets import exactness as ex

# -- the table --------------------------------------------------------------------------------


def test_table_has_the_five_rows_and_three_columns():
    md = ex.exactness_table_markdown()
    lines = md.splitlines()
    assert lines[0] == "| Situation | What goes wrong | Fix |"
    assert len(lines) == 2 + 5
    for row in ex.EXACTNESS_TABLE:
        assert row.situation in md and row.fix in md
        assert 0 <= row.assumption < len(ex.PROOF_ASSUMPTIONS)
    with_assumption = ex.exactness_table_markdown(with_assumption=True)
    assert with_assumption.splitlines()[0].endswith("| Assumption broken |")
    assert ex.PROOF_ASSUMPTIONS[1] in with_assumption


# -- uneven token counts ----------------------------------------------------------------------


def test_token_weighting_of_the_900_300_case():
    w = ex.token_weighting([900, 300])
    assert w.naive == (Fraction(1, 1800), Fraction(1, 600))
    assert w.exact == Fraction(1, 1200)
    assert w.relative == (Fraction(2, 3), Fraction(2))


@pytest.mark.parametrize("counts", [(5, 5), (1, 7, 3), (900, 300), (10, 20, 30, 40)])
def test_every_token_weight_sums_to_one(counts):
    w = ex.token_weighting(counts)
    assert sum(t * n for t, n in zip(counts, w.naive, strict=True)) == 1
    assert sum(counts) * w.exact == 1
    if len(set(counts)) == 1:
        assert all(r == 1 for r in w.relative)
    else:
        assert any(r != 1 for r in w.relative)


def test_token_weighting_rejects_empty_ranks():
    with pytest.raises(ValueError):
        ex.token_weighting([900, 0])


def test_weighted_mean_is_the_token_mean_and_plain_mean_is_not():
    rng = np.random.default_rng(0)
    counts = [9, 3]
    grads = [rng.standard_normal((t, 4)) for t in counts]
    true_mean = np.concatenate(grads).mean(axis=0)
    local_means = [g.mean(axis=0) for g in grads]
    np.testing.assert_allclose(ex.token_weighted_mean(local_means, counts), true_mean)
    naive = ex.mean_of_local_means(grads)
    assert np.abs(naive - true_mean).max() > 1e-3
    w = ex.token_weighting(counts)
    by_weights = sum(float(n) * g.sum(axis=0) for n, g in zip(w.naive, grads, strict=True))
    np.testing.assert_allclose(naive, by_weights)


# -- norms under different splits -------------------------------------------------------------


def _norm_problem(n=16):
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, 3)), rng.standard_normal((n, 4)), rng.standard_normal((3, 4))


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", "rms_norm"])
def test_norm_gradient_matches_torch(norm):
    x, t, w = _norm_problem()
    wt = torch.tensor(w, requires_grad=True)
    h = torch.tensor(x) @ wt
    if norm == "batch_norm":
        y = torch.nn.functional.batch_norm(h, None, None, training=True, eps=1e-5)
    elif norm == "layer_norm":
        y = torch.nn.functional.layer_norm(h, (4,), eps=1e-5)
    else:
        y = torch.nn.functional.rms_norm(h, (4,), eps=1e-6)
    torch.nn.functional.mse_loss(y, torch.tensor(t)).backward()
    np.testing.assert_allclose(ex.norm_gradient(norm, x, t, w), wt.grad.numpy(), atol=1e-12)


def test_only_batch_norm_changes_with_the_split():
    x, t, w = _norm_problem()
    gaps = ex.norm_split_gaps(x, t, w, [1, 2, 4, 8])
    assert set(gaps) == {"batch_norm", "layer_norm", "rms_norm"}
    assert gaps["batch_norm"][0] == 0.0
    assert min(gaps["batch_norm"][1:]) > 1e-3
    assert max(gaps["layer_norm"] + gaps["rms_norm"]) < 1e-12


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


def test_plot_norm_gaps_draws_one_line_per_norm():
    x, t, w = _norm_problem()
    gaps = ex.norm_split_gaps(x, t, w, [1, 2, 4])
    figure = ex.plot_norm_gaps([1, 2, 4], gaps)
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert sorted(label for label in labels if label in gaps) == sorted(gaps)


# -- global clipping --------------------------------------------------------------------------


def test_global_clipping_equals_torch_clipping_of_the_whole_gradient():
    rng = np.random.default_rng(3)
    shards = [rng.standard_normal(5) * s for s in (1.0, 4.0, 0.2)]
    result = ex.clip_sharded(shards, max_norm=1.0)
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
    result = ex.clip_sharded(shards, max_norm=10.0)
    assert result.global_coefficient == 1.0
    np.testing.assert_array_equal(np.concatenate(result.globally_clipped), np.concatenate(shards))


# -- reduction order --------------------------------------------------------------------------


def test_float32_sums_depend_on_the_order():
    sums = ex.sums_in_every_order([0.1, 0.2, 0.3, 0.7], dtype=np.float32)
    assert len(sums) == 24
    assert len(set(sums.values())) > 1
    a, b, c, d = (np.float32(v) for v in (0.1, 0.2, 0.3, 0.7))
    assert sums[(0, 1, 2, 3)] == float(((a + b) + c) + d)
    assert sums[(3, 2, 1, 0)] == float(((d + c) + b) + a)
    assert max(sums.values()) - min(sums.values()) < 1e-6


def test_integer_valued_sums_do_not_depend_on_the_order():
    sums = ex.sums_in_every_order([1.0, 2.0, 3.0, 4.0], dtype=np.float64)
    assert set(sums.values()) == {10.0}


def test_drift_problem_gradients_match_torch():
    problem = ex.DriftProblem.make(world_size=2, dtype=np.float64)
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
    result = ex.replica_drift(world_size=4, steps=300, deterministic=True)
    assert result.first_divergent_step is None
    assert not result.divergence.any() and not result.differing.any()
    for p in result.params[1:]:
        assert np.array_equal(p, result.params[0])


def test_deterministic_replicas_follow_full_batch_gradient_descent():
    steps, world = 200, 4
    result = ex.replica_drift(world, steps, deterministic=True, dtype=np.float64)
    problem = ex.DriftProblem.make(world, dtype=np.float64)
    w1, w2 = problem.w1.copy(), problem.w2.copy()
    for _ in range(steps):
        _, g1, g2 = problem.loss_and_grads(problem.x, problem.y, w1, w2)
        w1, w2 = w1 - 0.5 * g1, w2 - 0.5 * g2
    single = np.concatenate([w1.ravel(), w2.ravel()])
    np.testing.assert_allclose(result.params[0], single, atol=1e-10)
    assert result.losses[-1] < result.losses[0]


def test_per_rank_reduction_order_makes_replicas_drift_apart():
    result = ex.replica_drift(world_size=4, steps=1500, deterministic=False)
    assert result.first_divergent_step is not None
    assert result.differing[-1] > 0
    assert result.divergence[-1] > 10 * result.divergence[0] > 0


def test_two_ranks_cannot_drift_because_addition_commutes():
    result = ex.replica_drift(world_size=2, steps=200, deterministic=False)
    assert result.first_divergent_step is None


def test_drift_needs_two_ranks():
    with pytest.raises(ValueError):
        ex.replica_drift(world_size=1)


# -- widgets ----------------------------------------------------------------------------------


def test_token_widget_recomputes_when_a_slider_moves():
    widget = ex.build_token_weight_widget()
    assert widget.last_result.naive == (Fraction(1, 1800), Fraction(1, 600))
    before_png = bytes(widget.plot.value)
    assert "1/1800" in widget.table.value
    widget.controls["T_1"].value = 900
    assert widget.last_result.token_counts == (900, 900)
    assert widget.last_result.naive == (Fraction(1, 1800), Fraction(1, 1800))
    assert "1/600" not in widget.table.value
    after_png = bytes(widget.plot.value)
    assert after_png != before_png and after_png.startswith(b"\x89PNG")


def test_token_widget_has_one_slider_per_rank():
    widget = ex.build_token_weight_widget((10, 20, 30))
    assert list(widget.controls) == ["T_0", "T_1", "T_2"]
    assert widget.last_result.exact == Fraction(1, 60)


def test_drift_widget_recomputes_when_controls_change():
    widget = ex.build_drift_widget(world_size=2, steps=100)
    deterministic, per_rank = widget.last_result
    assert deterministic.deterministic and not per_rank.deterministic
    assert len(per_rank.divergence) == 100
    widget.controls["steps"].value = 150
    widget.controls["world_size"].value = 3
    deterministic, per_rank = widget.last_result
    assert len(per_rank.divergence) == 150 and len(per_rank.params) == 3
    assert "never" in widget.table.value
    assert bytes(widget.plot.value).startswith(b"\x89PNG")
