"""The graph structure, its layout, its picture and its DOT text."""

import re

import matplotlib
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

matplotlib.use("Agg")

from chainrule.course.graph import (  # noqa: E402
    MIN_TEXT_PX,
    Graph,
    GraphDrawing,
    draw,
    format_array,
    layout,
    node_gradients,
    to_dot,
)
from chainrule.engine import ops  # noqa: E402
from chainrule.engine.tensor import Tensor  # noqa: E402


@pytest.fixture
def data_parallel_loss(rng):
    """θ copied to three shards (fan-out ×3), the local losses summed, plus a concat."""
    theta = Tensor(rng.standard_normal((3, 2)), requires_grad=True, name="θ")
    x = Tensor(rng.standard_normal((6, 3)), requires_grad=True, name="x")
    shards = ops.split(x, 3)
    locals_ = [ops.tanh(shard @ theta).sum() for shard in shards]
    joined = ops.concat([ops.reshape(loss, (1,)) for loss in locals_], axis=0)
    loss = joined.sum()
    loss.name = "loss"
    return theta, x, loss


def by_name(graph, name):
    (node,) = [n for n in graph.nodes if n.name == name]
    return node


def test_graph_has_one_node_per_tensor_in_parents_first_order(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    # θ, x, 3 splits, 3×(matmul, tanh, sum, reshape), concat, sum
    assert len(graph.nodes) == 2 + 3 + 3 * 4 + 2
    assert graph.nodes[graph.root].name == "loss"
    assert graph.root == len(graph.nodes) - 1
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    assert all(position[p] < position[c] for p, c in graph.edges)


def test_fan_out_nodes_count_their_readers(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    theta, x = by_name(graph, "θ"), by_name(graph, "x")
    assert theta.fan_out == 3 and theta.sums_gradients
    assert x.fan_out == 3  # read by the three split pieces
    assert "Σ fan-out ×3" in theta.lines
    assert {n.name for n in graph.fan_out_nodes()} == {"θ", "x"}
    assert all(n.fan_out == 1 for n in graph.nodes if n.name not in ("θ", "x", "loss"))


def test_a_value_read_twice_by_one_op_counts_twice(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True, name="x")
    graph = Graph.from_tensor((x * x).sum())
    node = by_name(graph, "x")
    assert node.fan_out == 2 and node.sums_gradients
    assert graph.edges.count((node.id, graph.children(node.id)[0])) == 2
    (edge,) = [e for e in layout(graph).edges if e.parent == node.id]
    assert edge.count == 2  # drawn once, marked ×2


def test_constants_read_twice_are_not_marked_as_gradient_sums(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True)
    c = Tensor(rng.standard_normal(2), name="c")
    graph = Graph.from_tensor((x * c + c).sum())
    node = by_name(graph, "c")
    assert node.fan_out == 2 and not node.sums_gradients and node.kind == "constant"
    assert node.grad is None and not any(line.startswith("grad") for line in node.lines)


def test_scalar_constants_can_be_left_out(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True, name="x")
    loss = (x * 7.25 + x).sum()
    full = Graph.from_tensor(loss)
    (constant,) = [n for n in full.nodes if n.kind == "constant"]
    assert constant.title == "7.25"
    lean = Graph.from_tensor(loss, scalar_constants=False)
    assert len(lean.nodes) == len(full.nodes) - 1
    assert all(n.kind != "constant" for n in lean.nodes)
    assert sorted(n.id for n in lean.nodes) == list(range(len(lean.nodes)))
    assert by_name(lean, "x").fan_out == 2
    assert "7.25" not in to_dot(loss, scalar_constants=False) and "7.25" in to_dot(loss)
    assert len(draw(loss).layout.boxes) == len(lean.nodes)  # draw leaves them out by default


def test_every_node_shows_its_value_and_the_gradient_backward_computes(data_parallel_loss):
    theta, x, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    loss.backward()
    assert np.array_equal(by_name(graph, "θ").grad, theta.grad)
    assert np.array_equal(by_name(graph, "x").grad, x.grad)
    root = graph.nodes[graph.root]
    assert root.grad == 1.0 and root.data == pytest.approx(loss.data)
    # Intermediate values carry gradients too, though backward() does not keep them.
    inner = [n for n in graph.nodes if n.op == "tanh"]
    assert all(n.grad is not None and n.grad.shape == n.shape for n in inner)
    assert any(line.startswith("data ") for line in root.lines)
    assert any(line.startswith("grad ") for line in root.lines)
    assert theta.grad is not None and loss.grad is None  # drawing wrote no .grad


def test_node_gradients_need_a_scalar_root(rng):
    x = Tensor(rng.standard_normal(3), requires_grad=True)
    with pytest.raises(ValueError, match="scalar"):
        node_gradients(x * 2)
    graph = Graph.from_tensor(x * 2)  # a vector root: values, but no gradients
    assert all(n.grad is None for n in graph.nodes)


def test_values_are_formatted_short():
    assert format_array(np.array(1.5)) == "1.5"
    assert format_array(np.array([0.12345, -1.0])) == "[0.123, -1]"
    assert format_array(np.ones((4, 3))) == "4×3 ‖·‖=3.46"


def test_concat_and_split_are_routing_nodes(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    routing = graph.routing_nodes()
    assert sorted(n.op for n in routing) == ["concat", "split", "split", "split"]
    assert all("routing" in n.lines for n in routing)
    assert all(n.kind == "routing" for n in routing)


def test_names_mapping_overrides_tensor_names(rng):
    w = Tensor(rng.standard_normal(2), requires_grad=True, name="w")
    y = (w * 2).sum()
    graph = Graph.from_tensor(y, names={w: "θ", y: "L"})
    assert {n.name for n in graph.nodes} >= {"θ", "L"}
    assert "w" not in {n.name for n in graph.nodes}


def test_dot_lists_every_node_and_edge_with_the_marks(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    dot = to_dot(loss)
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    node_lines = re.findall(r"^  n(\d+) \[", dot, flags=re.M)
    edge_lines = re.findall(r"^  n(\d+) -> n(\d+);", dot, flags=re.M)
    assert len(node_lines) == len(graph.nodes)
    assert [(int(a), int(b)) for a, b in edge_lines] == graph.edges
    theta_line = next(line for line in dot.splitlines() if '"θ\\n' in line)
    assert "Σ fan-out ×3" in theta_line and "penwidth" in theta_line
    assert 'class="fan-out"' in theta_line
    assert dot.count('class="routing"') == 4


def test_dot_escapes_quotes_in_names(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True, name='say "hi"')
    assert r"say \"hi\"" in to_dot(x.sum())


def test_a_node_sits_one_layer_after_its_latest_input(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    layer = graph.layer_of()
    for node in graph.nodes:
        parents = graph.parents(node.id)
        if parents:
            assert layer[node.id] == 1 + max(layer[p] for p in parents)
        else:  # an input sits just before its first reader
            assert layer[node.id] == min(layer[c] for c in graph.children(node.id)) - 1
    assert layer[graph.root] == max(layer)


# -- readability ---------------------------------------------------------------------------------


def data_parallel_graph(world, seed=0):
    """The lessons' largest picture: θ copied to P ranks, a local loss each, one mean."""
    from chainrule.course.widgets.distributed_graph import data_parallel_graph as build

    rng = np.random.default_rng(seed)
    shards = [(rng.standard_normal(3), rng.standard_normal(3)) for _ in range(world)]
    return build(1.0, shards).loss


def assert_readable(drawing: GraphDrawing) -> None:
    assert drawing.smallest_text_px() >= MIN_TEXT_PX, drawing
    assert drawing.layout.edges_through_boxes() == []
    assert drawing.layout.overlapping_boxes() == []
    lay = drawing.layout
    for box in lay.boxes.values():  # every box inside the picture
        left, bottom, right, top = box.bounds
        assert 0 <= left and right <= lay.width and 0 <= bottom and top <= lay.height


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_data_parallel_graph_is_readable_up_to_four_ranks(world):
    assert_readable(draw(data_parallel_graph(world), title=f"P = {world}"))


@pytest.mark.parametrize("direction", ["LR", "TB"])
def test_both_directions_route_around_the_boxes(data_parallel_loss, direction):
    drawing = draw(data_parallel_loss[2], direction=direction)
    assert drawing.layout.direction == direction
    assert drawing.layout.edges_through_boxes() == []
    assert drawing.layout.overlapping_boxes() == []


def test_the_crossing_check_finds_an_edge_through_a_box(data_parallel_loss):
    lay = draw(data_parallel_loss[2]).layout
    edge = lay.edges[0]
    other = next(b for b in lay.boxes.values() if b.node not in (edge.parent, edge.child))
    through = type(edge)(edge.parent, edge.child, (edge.points[0], (other.x, other.y)))
    broken = type(lay)(lay.direction, lay.width, lay.height, lay.boxes, (through,))
    assert broken.edges_through_boxes() == [(edge.parent, edge.child, other.node)]


@given(st.lists(st.integers(0, 3), min_size=1, max_size=7), st.integers(0, 2**31 - 1))
def test_random_graphs_never_route_an_edge_through_a_box(reads, seed):
    """Random graphs with fan-outs, skips and concatenations: no edge through a box."""
    rng = np.random.default_rng(seed)
    values = [Tensor(rng.standard_normal(2), requires_grad=True, name=f"x{i}") for i in range(3)]
    for step, choice in enumerate(reads):
        a, b = values[int(rng.integers(len(values)))], values[-1]
        if choice == 0:
            values.append(a * b)
        elif choice == 1:
            values.append(ops.tanh(a) + b)
        elif choice == 2:
            values.append(ops.split(ops.concat([a, b]), 2)[step % 2])
        else:
            values.append(a - values[0])
    loss = sum((v.sum() for v in values[3:]), values[0].sum())
    lay = draw(loss).layout
    assert lay.edges_through_boxes() == [] and lay.overlapping_boxes() == []


def test_the_picture_is_a_png_of_the_layout_size(data_parallel_loss):
    drawing = draw(data_parallel_loss[2], title="a graph")
    png = drawing._repr_png_()
    assert png.startswith(b"\x89PNG")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == drawing.pixel_size()
    assert "a graph" in [t for _, _, t, _ in drawing.layout.texts]
    assert repr(drawing).startswith("GraphDrawing(")
