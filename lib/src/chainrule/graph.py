"""The computation graph behind a tensor: a data structure, Graphviz DOT text, and a picture.

:class:`Graph` lists one node per tensor (op name, shape, optional name such as θ or loss) and
one edge ``parent → child`` per read of a value by an op. Two kinds of node are marked, because
they are the two rules of split graphs:

- **fan-out** nodes, whose value is read more than once: their gradient is the *sum* of the
  incoming gradients (rule 1), labelled ``Σ fan-out ×k``;
- **routing** nodes (concat, split, stack), which move values without arithmetic: their VJP
  only routes gradient slices back (rule 2).

:func:`to_dot` emits DOT text for Graphviz; :func:`draw` renders the same graph with matplotlib
and a small layered layout (no Graphviz program needed): layers by longest path from the leaves,
order within a layer by the barycentre of the neighbours. :func:`to_svg` returns that picture as
SVG for notebooks.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chainrule.tensor import Tensor, topological_order

ROUTING_OPS = frozenset({"concat", "split", "stack"})

# Fill and edge colours of the node kinds (also used in the legend and the DOT text).
COLOURS = {
    "parameter": ("#dbeafe", "#1d4ed8"),  # leaf that requires a gradient
    "constant": ("#f3f4f6", "#6b7280"),  # leaf without gradient
    "op": ("#ffffff", "#374151"),
    "routing": ("#dcfce7", "#15803d"),
    "fan-out": ("#ffedd5", "#c2410c"),
}


@dataclass(frozen=True)
class Node:
    """One tensor of the graph."""

    id: int
    op: str  # "leaf" for inputs and parameters
    shape: tuple[int, ...]
    name: str | None
    requires_grad: bool
    fan_out: int  # how many times ops in the graph read this value
    value: float | None = None  # the number, for a scalar constant (shown instead of "leaf")

    @property
    def is_leaf(self) -> bool:
        """An input or parameter (computed by no op)."""
        return self.op == "leaf"

    @property
    def is_routing(self) -> bool:
        """A concat / split / stack: its VJP moves gradient slices, no arithmetic."""
        return self.op in ROUTING_OPS

    @property
    def sums_gradients(self) -> bool:
        """Read more than once and differentiable: backward adds its incoming gradients."""
        return self.fan_out > 1 and self.requires_grad

    @property
    def kind(self) -> str:
        """``fan-out``, ``routing``, ``parameter``, ``constant`` or ``op`` (first that applies)."""
        if self.sums_gradients:
            return "fan-out"
        if self.is_routing:
            return "routing"
        if self.is_leaf:
            return "parameter" if self.requires_grad else "constant"
        return "op"

    @property
    def label(self) -> str:
        """Text of the node: name (or op), op and shape, and the marks."""
        shape = "×".join(str(n) for n in self.shape) or "scalar"
        if self.value is not None and self.kind == "constant":
            lines = [self.name or f"{self.value:.4g}", "constant"]
        elif self.name:
            lines = [self.name, f"{self.op} {shape}"]
        else:
            lines = [self.op, shape]
        if self.is_routing:
            lines.append("routing")
        if self.sums_gradients:
            lines.append(f"Σ fan-out ×{self.fan_out}")
        return "\n".join(lines)


@dataclass
class Graph:
    """Nodes in topological order (parents first, the root last) and ``(parent, child)`` edges.

    A value read twice by the same op (``x * x``) gives two edges.
    """

    nodes: list[Node]
    edges: list[tuple[int, int]]
    root: int

    @classmethod
    def from_tensor(
        cls,
        tensor: Tensor,
        names: Mapping[Tensor, str] | None = None,
        scalar_constants: bool = True,
    ) -> Graph:
        """The graph of every tensor ``tensor`` was computed from.

        Labels come from ``names`` (a mapping tensor → name) or else from ``Tensor.name``.
        With ``scalar_constants=False`` the scalar constant leaves (the ``2`` of ``x * 2``)
        are left out: they carry no gradient and only clutter a picture.
        """
        names = names or {}
        order = topological_order(tensor, requires_grad_only=False)
        if not scalar_constants:
            order = [t for t in order if not _is_scalar_constant(t)]
        ids = {t: i for i, t in enumerate(order)}
        edges = [(ids[p], ids[t]) for t in order for p in t.parents if p in ids]
        fan_out = [0] * len(order)
        for parent, _ in edges:
            fan_out[parent] += 1
        nodes = [
            Node(
                id=i,
                op=t.op,
                shape=tuple(t.data.shape),
                name=names.get(t, t.name),
                requires_grad=t.requires_grad,
                fan_out=fan_out[i],
                value=float(t.data) if _is_scalar_constant(t) else None,
            )
            for i, t in enumerate(order)
        ]
        return cls(nodes=nodes, edges=edges, root=ids[tensor])

    def parents(self, node: int) -> list[int]:
        """Ids of the nodes ``node`` reads (repeated when it reads one twice)."""
        return [p for p, c in self.edges if c == node]

    def children(self, node: int) -> list[int]:
        """Ids of the nodes that read ``node`` (repeated when one reads it twice)."""
        return [c for p, c in self.edges if p == node]

    def fan_out_nodes(self) -> list[Node]:
        """The nodes where backward sums gradients (rule 1)."""
        return [n for n in self.nodes if n.sums_gradients]

    def routing_nodes(self) -> list[Node]:
        """The concat / split / stack nodes (rule 2)."""
        return [n for n in self.nodes if n.is_routing]

    def layers(self, sweeps: int = 4) -> list[list[int]]:
        """Node ids by layer, each layer in drawing order.

        Layer of a node = length of the longest path to it from a leaf. Within a layer, nodes
        are ordered by the mean position of their parents (sweeping down) and then of their
        children (sweeping up), ``sweeps`` times: the barycentre heuristic against crossings.
        """
        layer = [0] * len(self.nodes)
        parents: list[list[int]] = [[] for _ in self.nodes]
        children: list[list[int]] = [[] for _ in self.nodes]
        for p, c in self.edges:
            parents[c].append(p)
            children[p].append(c)
        for node in self.nodes:  # topological order: parents already have their layer
            if parents[node.id]:
                layer[node.id] = 1 + max(layer[p] for p in parents[node.id])
        rows: list[list[int]] = [[] for _ in range(max(layer) + 1)]
        for node in self.nodes:
            rows[layer[node.id]].append(node.id)

        position = _positions(rows)
        for _ in range(sweeps):
            for neighbours, sequence in ((parents, rows[1:]), (children, rows[-2::-1])):
                for row in sequence:
                    row.sort(key=lambda n, nb=neighbours: _barycentre(n, nb[n], position))
                    position.update(_positions([row]))
        return rows


def _positions(rows: list[list[int]]) -> dict[int, float]:
    """x position of each node: its index in its row, rows centred on 0."""
    return {n: i - (len(row) - 1) / 2 for row in rows for i, n in enumerate(row)}


def _barycentre(node: int, neighbours: list[int], position: dict[int, float]) -> float:
    if not neighbours:
        return position[node]
    return sum(position[n] for n in neighbours) / len(neighbours)


def _is_scalar_constant(t: Tensor) -> bool:
    return t.op == "leaf" and not t.requires_grad and t.data.ndim == 0


def _graph(
    tensor: Tensor | Graph, names: Mapping[Tensor, str] | None, scalar_constants: bool
) -> Graph:
    if isinstance(tensor, Graph):
        return tensor
    return Graph.from_tensor(tensor, names, scalar_constants=scalar_constants)


# -- DOT -------------------------------------------------------------------------------------


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(
    tensor: Tensor | Graph,
    names: Mapping[Tensor, str] | None = None,
    scalar_constants: bool = True,
) -> str:
    """Graphviz DOT text of the graph behind ``tensor`` (leaves at the top, root at the bottom)."""
    graph = _graph(tensor, names, scalar_constants)
    lines = [
        "digraph chainrule {",
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
    ]
    for node in graph.nodes:
        fill, edge = COLOURS[node.kind]
        attrs = [f"label={_dot_string(node.label)}", f'fillcolor="{fill}"', f'color="{edge}"']
        if node.sums_gradients:
            attrs += ["penwidth=2.5", f'xlabel="Σ×{node.fan_out}"']
        if node.is_routing:
            attrs.append("shape=cds")
        if node.id == graph.root:
            attrs.append("peripheries=2")
        attrs.append(f'class="{node.kind}"')
        lines.append(f"  n{node.id} [{', '.join(attrs)}];")
    for parent, child in graph.edges:
        lines.append(f"  n{parent} -> n{child};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- matplotlib picture ----------------------------------------------------------------------

X_STEP, Y_STEP = 2.4, 1.5  # distance between node centres, in data units
BOX_W, BOX_H = 2.0, 0.95


def draw(
    tensor: Tensor | Graph,
    ax: Any = None,
    names: Mapping[Tensor, str] | None = None,
    legend: bool = True,
    scalar_constants: bool = True,
) -> Any:
    """Draw the graph behind ``tensor`` with matplotlib and return the figure.

    Leaves at the top, the root at the bottom; fan-out nodes in orange with ``Σ fan-out ×k``,
    routing nodes in green, scalar constants by their value (or left out with
    ``scalar_constants=False``). With ``ax=None`` a new figure is made (not registered with pyplot,
    so a notebook shows it once, as the cell's value).
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, Patch

    graph = _graph(tensor, names, scalar_constants)
    rows = graph.layers()
    width = max(len(row) for row in rows)
    if ax is None:
        fig = Figure(figsize=(max(4.0, 1.35 * width * X_STEP / 1.5), 0.3 + 1.15 * len(rows)))
        ax = fig.add_subplot()
    xy = {
        n: (X_STEP * x, -Y_STEP * r)
        for r, row in enumerate(rows)
        for n, x in _positions([row]).items()
    }

    seen_pairs: dict[tuple[int, int], int] = {}
    for parent, child in graph.edges:
        k = seen_pairs.get((parent, child), 0)
        seen_pairs[(parent, child)] = k + 1
        (x0, y0), (x1, y1) = xy[parent], xy[child]
        ax.annotate(
            "",
            xy=(x1, y1 + BOX_H / 2),
            xytext=(x0, y0 - BOX_H / 2),
            arrowprops={
                "arrowstyle": "-|>",
                "color": "#4b5563",
                "lw": 1.0,
                "shrinkA": 1,
                "shrinkB": 1,
                "connectionstyle": f"arc3,rad={0.25 * k * (-1) ** k}",
            },
        )
    for node in graph.nodes:
        fill, edge = COLOURS[node.kind]
        x, y = xy[node.id]
        ax.add_patch(
            FancyBboxPatch(
                (x - BOX_W / 2, y - BOX_H / 2),
                BOX_W,
                BOX_H,
                boxstyle="round,pad=0.02,rounding_size=0.12",
                facecolor=fill,
                edgecolor=edge,
                linewidth=2.5 if node.sums_gradients or node.id == graph.root else 1.0,
                zorder=2,
            )
        )
        ax.text(x, y, node.label, ha="center", va="center", fontsize=7.5, zorder=3)

    xs = [p[0] for p in xy.values()]
    ax.set_xlim(min(xs) - BOX_W, max(xs) + BOX_W)
    ax.set_ylim(-Y_STEP * (len(rows) - 1) - BOX_H, BOX_H)
    ax.set_aspect("equal")
    ax.axis("off")
    if legend:
        kinds = ["parameter", "constant", "op", "routing", "fan-out"]
        text = {"fan-out": "fan-out (Σ of gradients)", "routing": "routing (concat/split)"}
        handles = [
            Patch(facecolor=COLOURS[k][0], edgecolor=COLOURS[k][1], label=text.get(k, k))
            for k in kinds
        ]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return ax.figure


@dataclass(frozen=True)
class SVG:
    """An SVG picture that Jupyter displays inline (``_repr_svg_``)."""

    text: str

    def _repr_svg_(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


def to_svg(
    tensor: Tensor | Graph,
    names: Mapping[Tensor, str] | None = None,
    scalar_constants: bool = True,
) -> SVG:
    """The picture of :func:`draw` as SVG text (text kept as text, not glyph outlines)."""
    from matplotlib import rc_context

    with rc_context({"svg.fonttype": "none"}):
        figure = draw(tensor, names=names, scalar_constants=scalar_constants)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    return SVG(buffer.getvalue())
