"""Lesson 7's global graph: θ fans out to P copies, and backward sums them into the all-reduce."""

import numpy as np
import pytest
from chainrule import graph
from chainrule.widgets import distributed_graph as dg


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


def test_drawing_names_every_copy():
    figure = dg.draw_global_graph(dg.data_parallel_graph(1.0, _shards(2)))
    texts = [t.get_text() for t in figure.axes[0].texts if t.get_text()]  # arrows have no text
    joined = " ".join(texts)
    assert "θ on rank 0" in joined and "θ on rank 1" in joined and "fan-out ×2" in joined
    drawn = graph.Graph.from_tensor(
        dg.data_parallel_graph(1.0, _shards(2)).loss, scalar_constants=False
    )
    assert len(texts) == len(drawn.nodes)  # one label per node, no scalar constants
    assert not any(n.shape == () and n.kind == "constant" for n in drawn.nodes)


def test_no_shards_is_an_error():
    with pytest.raises(ValueError):
        dg.data_parallel_graph(1.0, [])
