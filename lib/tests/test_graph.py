"""The graph structure, its DOT text and its matplotlib picture."""

import re

import matplotlib
import pytest

matplotlib.use("Agg")

from chainrule import ops  # noqa: E402
from chainrule.graph import Graph, Node, draw, to_dot, to_svg  # noqa: E402
from chainrule.tensor import Tensor  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402


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
    assert "Σ fan-out ×3" in theta.label
    assert {n.name for n in graph.fan_out_nodes()} == {"θ", "x"}
    assert all(n.fan_out == 1 for n in graph.nodes if n.name not in ("θ", "x", "loss"))


def test_a_value_read_twice_by_one_op_counts_twice(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True, name="x")
    graph = Graph.from_tensor((x * x).sum())
    node = by_name(graph, "x")
    assert node.fan_out == 2 and node.sums_gradients
    assert graph.edges.count((node.id, graph.children(node.id)[0])) == 2


def test_constants_read_twice_are_not_marked_as_gradient_sums(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True)
    c = Tensor(rng.standard_normal(2), name="c")
    graph = Graph.from_tensor((x * c + c).sum())
    node = by_name(graph, "c")
    assert node.fan_out == 2 and not node.sums_gradients and node.kind == "constant"


def test_scalar_constants_show_their_value_or_can_be_left_out(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True, name="x")
    loss = (x * 7.25 + x).sum()
    full = Graph.from_tensor(loss)
    (constant,) = [n for n in full.nodes if n.kind == "constant"]
    assert constant.value == 7.25 and constant.label.splitlines() == ["7.25", "constant"]
    lean = Graph.from_tensor(loss, scalar_constants=False)
    assert len(lean.nodes) == len(full.nodes) - 1
    assert all(n.kind != "constant" for n in lean.nodes)
    assert sorted(n.id for n in lean.nodes) == list(range(len(lean.nodes)))
    assert all(p < len(lean.nodes) and c < len(lean.nodes) for p, c in lean.edges)
    assert by_name(lean, "x").fan_out == 2
    assert "7.25" not in to_dot(loss, scalar_constants=False) and "7.25" in to_dot(loss)
    patches = draw(loss, scalar_constants=False).axes[0].patches
    assert len([p for p in patches if isinstance(p, FancyBboxPatch)]) == len(lean.nodes)


def test_concat_and_split_are_routing_nodes(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    routing = graph.routing_nodes()
    assert sorted(n.op for n in routing) == ["concat", "split", "split", "split"]
    assert all("routing" in n.label for n in routing)
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
    assert (
        "Σ fan-out ×3" in theta_line
        and "penwidth" in theta_line
        and 'class="fan-out"' in theta_line
    )
    assert dot.count('class="routing"') == 4


def test_dot_escapes_quotes_in_names(rng):
    x = Tensor(rng.standard_normal(2), requires_grad=True, name='say "hi"')
    assert r"say \"hi\"" in to_dot(x.sum())


def test_layers_are_longest_paths_from_the_leaves(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    rows = graph.layers()
    layer_of = {n: i for i, row in enumerate(rows) for n in row}
    assert sorted(n for row in rows for n in row) == [n.id for n in graph.nodes]
    for node in graph.nodes:
        parents = graph.parents(node.id)
        expected = 0 if not parents else 1 + max(layer_of[p] for p in parents)
        assert layer_of[node.id] == expected
    assert layer_of[by_name(graph, "θ").id] == 0
    assert layer_of[graph.root] == len(rows) - 1


def count_crossings(graph, rows):
    position = {n: i for row in rows for i, n in enumerate(row)}
    layer = {n: k for k, row in enumerate(rows) for n in row}
    edges = [(p, c) for p, c in graph.edges if layer[c] == layer[p] + 1]
    return sum(
        1
        for i, (p1, c1) in enumerate(edges)
        for p2, c2 in edges[i + 1 :]
        if layer[p1] == layer[p2]
        and (position[p1] - position[p2]) * (position[c1] - position[c2]) < 0
    )


def hand_made_graph(edges, n):
    nodes = [
        Node(id=i, op="op", shape=(), name=str(i), requires_grad=True, fan_out=0) for i in range(n)
    ]
    return Graph(nodes=nodes, edges=edges, root=n - 1)


def test_barycentre_ordering_removes_crossings_of_parallel_branches():
    """Leaves 0, 1 feed 3, 2 (listed in the other order), which meet in 4: one crossing."""
    graph = hand_made_graph([(1, 2), (0, 3), (2, 4), (3, 4)], 5)
    assert count_crossings(graph, graph.layers(sweeps=0)) == 1
    rows = graph.layers(sweeps=2)
    assert count_crossings(graph, rows) == 0
    assert rows[0] == [0, 1] and rows[1] == [3, 2]


def test_barycentre_ordering_on_a_real_graph_has_no_crossings(data_parallel_loss):
    _, _, loss = data_parallel_loss
    graph = Graph.from_tensor(loss)
    assert count_crossings(graph, graph.layers()) == 0


def test_draw_returns_a_figure_with_one_box_per_node_and_a_legend(data_parallel_loss):
    _, _, loss = data_parallel_loss
    fig = draw(loss)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == len(Graph.from_tensor(loss).nodes)
    texts = [t.get_text() for t in ax.texts]
    assert any("Σ fan-out ×3" in t for t in texts)
    assert ax.get_legend() is not None
    fig.canvas.draw()  # renders without error


def test_draw_onto_a_given_axes(rng):
    x = Tensor(rng.standard_normal(3), requires_grad=True)
    fig = Figure()
    ax = fig.add_subplot()
    assert draw((x * x).sum(), ax=ax, legend=False) is fig
    assert ax.get_legend() is None


def test_svg_has_the_labels_as_text(data_parallel_loss):
    _, _, loss = data_parallel_loss
    svg = to_svg(loss)
    text = svg._repr_svg_()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "θ" in text and "loss" in text and "fan-out ×3" in text
    assert str(svg) == text
