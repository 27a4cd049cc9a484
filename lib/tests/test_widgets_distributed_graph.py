"""The global graphs of lessons 3 and 8: a replicated θ fans out to P copies and backward sums
them (the all-reduce); a sharded θ gets its own slice of the gradient with no sum at all."""

import numpy as np
import pytest
from chainrule.course import graph
from chainrule.course.widgets import distributed_graph as dg


def _shards(world, size=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size), rng.standard_normal(size)) for _ in range(world)]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_fan_out_sum_is_the_full_batch_gradient(world):
    shards = _shards(world)
    g = dg.data_parallel_graph(0.7, shards)
    g.loss.backward()
    x = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    full = np.mean((0.7 * x - y) * x)  # ∂/∂θ of mean ½(θx − y)² over all examples
    assert g.theta.grad == pytest.approx(full, abs=1e-14)
    assert g.theta.grad == pytest.approx(sum(c.grad for c in g.copies), abs=1e-14)
    for copy, (xs, ys) in zip(g.copies, shards, strict=True):
        assert copy.grad == pytest.approx(np.mean((0.7 * xs - ys) * xs) / world, abs=1e-14)


def test_the_worked_example_of_the_syllabus():
    shards = [
        (np.array([1.0, 2.0]), np.array([0.0, 1.0])),
        (np.array([3.0, 4.0]), np.array([1.0, 2.0])),
    ]
    g = dg.data_parallel_graph(1.0, shards)
    g.loss.backward()
    local = [2 * c.grad for c in g.copies]  # ∇L_p = P · θ̄_p
    assert local == [pytest.approx(1.5), pytest.approx(7.0)]
    assert g.theta.grad == pytest.approx(4.25)


def test_graph_shape_theta_fans_out_to_every_rank():
    g = dg.data_parallel_graph(1.0, _shards(3))
    full = graph.Graph.from_tensor(g.loss)
    theta = next(n for n in full.nodes if n.name == "θ")
    assert theta.fan_out == 3 and theta.sums_gradients
    names = {n.name for n in full.nodes}
    assert {"θ on rank 0", "θ on rank 2", "L_1", "x on rank 2"} <= names


def test_drawing_names_every_copy_and_marks_it_as_a_copy():
    drawing = dg.draw_global_graph(dg.data_parallel_graph(1.0, _shards(2)))
    titles = [box.lines[0] for box in drawing.layout.boxes.values()]
    assert "θ on rank 0 = copy" in titles and "θ on rank 1 = copy" in titles
    theta = next(box for box in drawing.layout.boxes.values() if box.lines[0] == "θ")
    assert "Σ fan-out ×2" in theta.lines
    assert not any(
        box.kind == "constant" and box.lines[0][0].isdigit()
        for box in drawing.layout.boxes.values()
    )  # no scalar constants


@pytest.mark.parametrize("world", [1, 2, 4])
def test_a_sharded_parameter_gets_its_slice_of_the_gradient_without_a_sum(world):
    rng = np.random.default_rng(world)
    theta, x, y = (
        rng.standard_normal(2 * world),
        rng.standard_normal((5, 2 * world)),
        rng.standard_normal(5),
    )
    g = dg.sharded_parameter_graph(theta, x, y, world)
    g.loss.backward()
    residual = x @ theta - y
    full = x.T @ residual / len(y)  # ∇ of mean ½(Xθ − y)² on one device
    np.testing.assert_allclose(np.concatenate([s.grad for s in g.shards]), full, atol=1e-14)
    np.testing.assert_allclose(g.prediction.data, x @ theta, atol=1e-14)
    for z in g.partials:  # the sum hands every addend the same gradient
        np.testing.assert_array_equal(z.grad, g.prediction.grad)
    full_graph = graph.Graph.from_tensor(g.loss)
    assert [n.name for n in full_graph.fan_out_nodes()] == []  # nothing is replicated


def test_the_sharded_parameter_must_cut_evenly():
    with pytest.raises(ValueError, match="equal slices"):
        dg.sharded_parameter_graph(np.ones(3), np.ones((2, 3)), np.ones(2), 2)


def test_no_shards_is_an_error():
    with pytest.raises(ValueError):
        dg.data_parallel_graph(1.0, [])
