"""The computation graph behind a tensor: a data structure, a layout, a picture, DOT text.

:class:`Graph` lists one node per tensor (its op, shape, name, value and gradient) and one edge
``parent → child`` per read of a value by an op. Two kinds of node are marked, because they
are the two rules of split graphs:

- **fan-out** nodes, whose value is read more than once: their gradient is the *sum* of the
  incoming gradients (rule 1), labelled ``Σ fan-out ×k``;
- **routing** nodes (concat, split, stack), which move values without arithmetic: their VJP
  only routes gradient slices back (rule 2).

A **checkpoint** node (a part of the graph that keeps only its inputs and output, and is run
again in the backward: :func:`chainrule.engine.recompute.checkpoint`) is marked too, labelled
``recomputed in the backward``.

Like micrograd's drawing, every node shows its value (``data``) and the gradient of the loss
with respect to it (``grad``). The gradients are the engine's own VJPs run once more from
the root (:func:`node_gradients`), so intermediate values show theirs too, not only the
leaves that ``backward()`` keeps.

:func:`layout` places the nodes in layers (a Sugiyama-style layered drawing): a node sits one
layer after its latest input, an edge that skips layers bends through a reserved slot in
every layer it passes, and within a layer the order follows the mean position of the
neighbours. Every edge leaves its box straight, crosses the gap between two layers, and
enters the next box straight, so by construction no edge passes through a box;
:meth:`Layout.edges_through_boxes` checks it anyway. :func:`draw` turns the layout into a
:class:`GraphDrawing`, which a notebook shows as a PNG and which knows how large its text
is on the page (:meth:`GraphDrawing.smallest_text_px`). :func:`to_dot` writes the same graph
as Graphviz DOT text.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np

from chainrule.engine.recompute import CHECKPOINT_OP
from chainrule.engine.tensor import Tensor, topological_order

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROUTING_OPS = frozenset({"concat", "split", "stack"})

# Fill and edge colours of the node kinds (also used in the legend and the DOT text).
COLOURS = {
    "parameter": ("#dbeafe", "#1d4ed8"),  # leaf that requires a gradient
    "constant": ("#f3f4f6", "#6b7280"),  # leaf without gradient
    "op": ("#ffffff", "#374151"),
    "routing": ("#dcfce7", "#15803d"),
    "fan-out": ("#ffedd5", "#c2410c"),
    "checkpoint": ("#ede9fe", "#6d28d9"),
}
LEGEND_TEXT = {
    "parameter": "parameter",
    "constant": "constant",
    "op": "operation",
    "routing": "routing (concat / split / stack)",
    "fan-out": "fan-out (Σ of gradients)",
    "checkpoint": "checkpoint (run again in the backward)",
}

DPI = 100
"""Pixels per inch of the PNG a notebook shows (JupyterLab shows it at this size)."""
DISPLAY_WIDTH_PX = 940
"""The narrowest page the course is read on: JupyterLab's output area at 1400×900 with the file
browser open is about 960 CSS pixels wide. A wider picture is scaled down to this width."""
MIN_TEXT_PX = 9.0
"""The smallest text a drawing may show at display size."""

FONT_PT = 7.5  # node text: 7.5 pt at 100 dpi is 10.4 px
TITLE_PT = 9.0
LINE_PT = 1.32 * FONT_PT  # distance between two text lines of a box
BOX_PAD_PT = 4.0  # text to box edge
LAYER_GAP_PT = 20.0  # between two layers: room for the edges
NODE_GAP_PT = 9.0  # between two boxes of one layer
SLOT_PT = 5.0  # the room an edge takes where it passes a layer
MARGIN_PT = 6.0

Direction = Literal["LR", "TB"]


# -- the graph ---------------------------------------------------------------------------------


def node_gradients(root: Tensor) -> dict[Tensor, np.ndarray]:
    """``∂root/∂t`` for every tensor ``t`` of the graph that requires a gradient.

    The engine's VJPs run once more from a scalar ``root`` (seed 1), in the reverse
    topological order :meth:`Tensor.backward` uses, adding the gradients of a value read
    several times (rule 1). Unlike ``backward()`` this keeps every intermediate gradient and
    writes no ``.grad``. Graphs with collectives must run inside their world.
    """
    if root.data.size != 1:
        raise ValueError(f"node gradients need a scalar root, got shape {root.data.shape}")
    grads: dict[Tensor, np.ndarray] = {root: np.ones_like(root.data)}
    for node in reversed(topological_order(root)):
        g = grads.get(node)
        if g is None or node._vjp is None:
            continue
        for parent, pg in zip(node.parents, node._vjp(g), strict=True):
            if pg is None or not parent.requires_grad:
                continue
            grads[parent] = grads[parent] + pg if parent in grads else np.asarray(pg)
    return grads


@dataclass(frozen=True, eq=False)
class Node:
    """One tensor of the graph: its op, shape, name, value and (when known) gradient."""

    id: int
    op: str  # "leaf" for inputs and parameters
    shape: tuple[int, ...]
    name: str | None
    requires_grad: bool
    fan_out: int  # how many times ops in the graph read this value
    data: np.ndarray | None = None
    grad: np.ndarray | None = None

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
    def is_checkpoint(self) -> bool:
        """A part of the graph kept as one node and run again in the backward
        (:func:`chainrule.engine.recompute.checkpoint`)."""
        return self.op == CHECKPOINT_OP

    @property
    def kind(self) -> str:
        """``fan-out``, ``routing``, ``checkpoint``, ``parameter``, ``constant`` or ``op`` (first
        that applies)."""
        if self.sums_gradients:
            return "fan-out"
        if self.is_routing:
            return "routing"
        if self.is_checkpoint:
            return "checkpoint"
        if self.is_leaf:
            return "parameter" if self.requires_grad else "constant"
        return "op"

    @property
    def title(self) -> str:
        """The first line of the box: the name (with the op that made it) or the op."""
        if self.is_leaf:
            if self.name:
                return self.name
            if self.data is not None and self.data.size == 1:
                return format_array(self.data)
            return "input" if not self.requires_grad else "parameter"
        return f"{self.name} = {self.op}" if self.name else self.op

    @property
    def lines(self) -> list[str]:
        """Every line of the box: title, value, gradient, and the marks of the two rules."""
        lines = [self.title]
        shape = "×".join(str(n) for n in self.shape)
        if self.data is not None:
            lines.append(f"data {format_array(self.data)}")
        elif shape:
            lines.append(f"shape {shape}")
        if self.grad is not None:
            lines.append(f"grad {format_array(self.grad)}")
        if self.is_routing:
            lines.append("routing")
        if self.is_checkpoint:
            lines.append("recomputed in the backward")
        if self.sums_gradients:
            lines.append(f"Σ fan-out ×{self.fan_out}")
        return lines

    @property
    def label(self) -> str:
        """:attr:`lines` joined by newlines."""
        return "\n".join(self.lines)


def format_array(values: np.ndarray) -> str:
    """A value as a box shows it: ``1.5``; ``[0.12, -1.3]`` up to three entries; else the shape
    and the norm, ``4×3 ‖·‖=2.1``."""
    array = np.asarray(values, dtype=float)
    if array.size == 1:
        return f"{float(array.reshape(())):.4g}"
    if array.ndim == 1 and array.size <= 3:
        return "[" + ", ".join(f"{v:.3g}" for v in array) + "]"
    shape = "×".join(str(n) for n in array.shape)
    return f"{shape} ‖·‖={float(np.linalg.norm(array)):.3g}"


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
        values: bool = True,
    ) -> Graph:
        """The graph of every tensor ``tensor`` was computed from.

        Labels come from ``names`` (a mapping tensor → name) or else from ``Tensor.name``.
        With ``scalar_constants=False`` the scalar constant leaves (the ``2`` of ``x * 2``)
        are left out: they carry no gradient and only clutter a picture. With ``values`` the
        nodes carry their values and, for a scalar root that requires a gradient, the
        gradients of :func:`node_gradients`.
        """
        names = names or {}
        order = topological_order(tensor, requires_grad_only=False)
        if not scalar_constants:
            order = [t for t in order if not _is_scalar_constant(t) or t is tensor]
        ids = {t: i for i, t in enumerate(order)}
        edges = [(ids[p], ids[t]) for t in order for p in t.parents if p in ids]
        fan_out = [0] * len(order)
        for parent, _ in edges:
            fan_out[parent] += 1
        grads: Mapping[Tensor, np.ndarray] = {}
        if values and tensor.requires_grad and tensor.data.size == 1:
            grads = node_gradients(tensor)
        nodes = [
            Node(
                id=i,
                op=t.op,
                shape=tuple(t.data.shape),
                name=names.get(t, t.name),
                requires_grad=t.requires_grad,
                fan_out=fan_out[i],
                data=np.array(t.data) if values else None,
                grad=grads.get(t) if values else None,
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

    def layer_of(self) -> list[int]:
        """The layer of every node: one after its latest input; an input sits just before its
        first reader, so that it does not stretch across the picture."""
        layer = [0] * len(self.nodes)
        parents: list[list[int]] = [[] for _ in self.nodes]
        children: list[list[int]] = [[] for _ in self.nodes]
        for p, c in self.edges:
            parents[c].append(p)
            children[p].append(c)
        for node in self.nodes:  # topological order: the parents already have their layer
            if parents[node.id]:
                layer[node.id] = 1 + max(layer[p] for p in parents[node.id])
        for node in reversed(self.nodes):
            if not parents[node.id] and children[node.id]:
                layer[node.id] = min(layer[c] for c in children[node.id]) - 1
        return layer


def _is_scalar_constant(t: Tensor) -> bool:
    return t.op == "leaf" and not t.requires_grad and t.data.ndim == 0


def _graph(
    tensor: Tensor | Graph, names: Mapping[Tensor, str] | None, scalar_constants: bool
) -> Graph:
    if isinstance(tensor, Graph):
        return tensor
    return Graph.from_tensor(tensor, names, scalar_constants=scalar_constants)


# -- layout ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """A node's box in the picture: centre, size (points, y up) and its lines of text."""

    node: int
    x: float
    y: float
    width: float
    height: float
    lines: tuple[str, ...]
    kind: str
    emphasis: bool  # a fan-out or the root: a thicker border

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """``(left, bottom, right, top)``."""
        return (
            self.x - self.width / 2,
            self.y - self.height / 2,
            self.x + self.width / 2,
            self.y + self.height / 2,
        )


@dataclass(frozen=True)
class Edge:
    """An edge as drawn: a polyline (points) from the parent's box to the child's box."""

    parent: int
    child: int
    points: tuple[tuple[float, float], ...]
    count: int = 1  # how many times the child reads the parent


@dataclass(frozen=True)
class Layout:
    """Everything :func:`draw` puts on the page, in points (1/72 inch), y pointing up.

    ``texts`` are ``(x, y, text, size_pt)`` of the title and the legend; the boxes' own text is
    ``FONT_PT`` points.
    """

    direction: Direction
    width: float
    height: float
    boxes: dict[int, Box]
    edges: tuple[Edge, ...]
    texts: tuple[tuple[float, float, str, float], ...] = ()
    legend: tuple[tuple[float, float, str], ...] = ()  # swatch position and kind

    @property
    def font_sizes(self) -> list[float]:
        """Every text size of the picture, in points."""
        return [FONT_PT] * bool(self.boxes) + [size for *_, size in self.texts]

    def edges_through_boxes(self) -> list[tuple[int, int, int]]:
        """``(parent, child, node)`` for every edge that passes through a box other than its
        own two ends (an empty list for a readable picture)."""
        hits = []
        for edge in self.edges:
            segments = list(zip(edge.points[:-1], edge.points[1:], strict=True))
            for box in self.boxes.values():
                if box.node in (edge.parent, edge.child):
                    continue
                if any(_segment_meets_rectangle(a, b, box.bounds) for a, b in segments):
                    hits.append((edge.parent, edge.child, box.node))
        return hits

    def overlapping_boxes(self) -> list[tuple[int, int]]:
        """Pairs of boxes that overlap (none in a layout of :func:`layout`)."""
        boxes = list(self.boxes.values())
        pairs = []
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                (al, ab, ar, at), (bl, bb, br, bt) = a.bounds, b.bounds
                if al < br and bl < ar and ab < bt and bb < at:
                    pairs.append((a.node, b.node))
        return pairs


def _segment_meets_rectangle(
    a: tuple[float, float], b: tuple[float, float], rect: tuple[float, float, float, float]
) -> bool:
    """Whether the segment a-b enters the open rectangle (Liang-Barsky clipping)."""
    left, bottom, right, top = rect
    eps = 1e-6
    left, bottom, right, top = left + eps, bottom + eps, right - eps, top - eps
    (x0, y0), (x1, y1) = a, b
    dx, dy = x1 - x0, y1 - y0
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, x0 - left), (dx, right - x0), (-dy, y0 - bottom), (dy, top - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return True


def _text_width(text: str, size: float, bold: bool = False) -> float:
    """The width of ``text`` in points, as matplotlib renders it."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    prop = FontProperties(size=size, weight="bold" if bold else "normal")
    width, _, _ = TextToPath().get_text_width_height_descent(text, prop, ismath=False)
    return float(width)


def _box_size(lines: Sequence[str]) -> tuple[float, float]:
    widths = [_text_width(line, FONT_PT, bold=i == 0) for i, line in enumerate(lines)]
    return max(widths) + 2 * BOX_PAD_PT, LINE_PT * len(lines) + 2 * BOX_PAD_PT - 2


@dataclass
class _Item:
    """A box or an edge's slot in one layer, during layout (u: along the layers)."""

    key: int  # node id (>= 0) or a slot (< 0)
    layer: int
    along: float  # size along the layers
    across: float  # size across them
    neighbours: list[int] = field(default_factory=list)
    v: float = 0.0


def layout(graph: Graph, direction: Direction = "LR", title: str | None = None) -> Layout:
    """Place the boxes and route the edges (see the module docstring)."""
    layer = graph.layer_of()
    items: dict[int, _Item] = {}
    for node in graph.nodes:
        w, h = _box_size(node.lines)
        along, across = (w, h) if direction == "LR" else (h, w)
        items[node.id] = _Item(node.id, layer[node.id], along, across)
    counts: dict[tuple[int, int], int] = {}
    for edge in graph.edges:
        counts[edge] = counts.get(edge, 0) + 1
    chains: dict[tuple[int, int], list[int]] = {}
    next_slot = -1
    for p, c in counts:
        chain = [p]
        for k in range(layer[p] + 1, layer[c]):
            items[next_slot] = _Item(next_slot, k, 0.0, SLOT_PT)
            chain.append(next_slot)
            next_slot -= 1
        chain.append(c)
        for left, right in zip(chain[:-1], chain[1:], strict=True):
            items[left].neighbours.append(right)
            items[right].neighbours.append(left)
        chains[(p, c)] = chain

    rows: list[list[int]] = [[] for _ in range(max(layer) + 1)]
    for key in sorted(items, key=lambda k: (k < 0, k if k >= 0 else -k)):
        rows[items[key].layer].append(key)
    _order_rows(rows, items)
    _place_across(rows, items)

    # Along the layers: each layer as thick as its thickest box.
    thickness = [max((items[k].along for k in row), default=0.0) for row in rows]
    starts = [0.0]
    for t in thickness[:-1]:
        starts.append(starts[-1] + t + LAYER_GAP_PT)
    title_room = TITLE_PT * 1.8 if title else 0.0
    low = min(item.v - item.across / 2 for item in items.values())
    high = max(item.v + item.across / 2 for item in items.values())
    extent_along = starts[-1] + thickness[-1]
    extent_across = high - low

    def to_xy(u: float, v: float) -> tuple[float, float]:
        v = v - low
        if direction == "LR":
            return MARGIN_PT + u, MARGIN_PT + extent_across - v
        return MARGIN_PT + v, MARGIN_PT + extent_along - u

    boxes = {}
    for node in graph.nodes:
        item = items[node.id]
        k = item.layer
        x, y = to_xy(starts[k] + thickness[k] / 2, item.v)
        w, h = (item.along, item.across) if direction == "LR" else (item.across, item.along)
        emphasis = node.sums_gradients or node.id == graph.root
        boxes[node.id] = Box(node.id, x, y, w, h, tuple(node.lines), node.kind, emphasis)

    edges = []
    for (p, c), chain in chains.items():
        a, b = items[p], items[c]
        points = [
            (starts[a.layer] + thickness[a.layer] / 2 + a.along / 2, a.v),
            (starts[a.layer] + thickness[a.layer], a.v),
        ]
        for slot in chain[1:-1]:
            s = items[slot]
            points += [(starts[s.layer], s.v), (starts[s.layer] + thickness[s.layer], s.v)]
        points += [
            (starts[b.layer], b.v),
            (starts[b.layer] + thickness[b.layer] / 2 - b.along / 2, b.v),
        ]
        xy = [to_xy(u, v) for u, v in points]
        deduplicated = [xy[0]] + [q for prev, q in zip(xy[:-1], xy[1:], strict=True) if q != prev]
        edges.append(Edge(p, c, tuple(deduplicated), counts[(p, c)]))

    width = 2 * MARGIN_PT + (extent_along if direction == "LR" else extent_across)
    height = 2 * MARGIN_PT + (extent_across if direction == "LR" else extent_along)
    texts: list[tuple[float, float, str, float]] = []
    legend: list[tuple[float, float, str]] = []
    # The legend: one swatch and word per kind shown, in a row under the picture.
    kinds = [k for k in COLOURS if any(b.kind == k for b in boxes.values())]
    legend_height = FONT_PT * 2.2
    x = MARGIN_PT
    for kind in kinds:
        legend.append((x, MARGIN_PT + FONT_PT * 0.6, kind))
        texts.append((x + FONT_PT * 1.6, MARGIN_PT + FONT_PT * 1.0, LEGEND_TEXT[kind], FONT_PT))
        x += FONT_PT * 1.6 + _text_width(LEGEND_TEXT[kind], FONT_PT) + FONT_PT * 1.5
    width = max(width, x + MARGIN_PT)
    shift = legend_height
    boxes = {k: _shifted(b, shift) for k, b in boxes.items()}
    edges = [
        Edge(e.parent, e.child, tuple((px, py + shift) for px, py in e.points), e.count)
        for e in edges
    ]
    height += shift
    if title:
        width = max(width, _text_width(title, TITLE_PT, bold=True) + 2 * MARGIN_PT)
        texts.append((width / 2, height + title_room / 2 - 2, title, TITLE_PT))
        height += title_room
    # Whole pixels at DPI, so that the PNG is exactly the layout's size.
    width, height = (math.ceil(v / 72 * DPI) * 72 / DPI + 1e-6 for v in (width, height))
    return Layout(direction, width, height, boxes, tuple(edges), tuple(texts), tuple(legend))


def _shifted(box: Box, dy: float) -> Box:
    return Box(
        box.node, box.x, box.y + dy, box.width, box.height, box.lines, box.kind, box.emphasis
    )


def _order_rows(rows: list[list[int]], items: dict[int, _Item], sweeps: int = 8) -> None:
    """Order every layer by the mean position of the neighbours in the layer before (sweeping
    forward) and after (sweeping back): the barycentre heuristic against crossings."""

    def positions() -> dict[int, float]:
        return {k: i - (len(row) - 1) / 2 for row in rows for i, k in enumerate(row)}

    where = positions()
    for sweep in range(sweeps):
        forward = sweep % 2 == 0
        sequence = range(1, len(rows)) if forward else range(len(rows) - 2, -1, -1)
        for r in sequence:
            other = r - 1 if forward else r + 1
            in_other = set(rows[other])

            def centre(k: int, other_row: set[int] = in_other) -> float:
                near = [where[n] for n in items[k].neighbours if n in other_row]
                return sum(near) / len(near) if near else where[k]

            rows[r].sort(key=centre)
            where.update({k: i - (len(rows[r]) - 1) / 2 for i, k in enumerate(rows[r])})


def _place_across(rows: list[list[int]], items: dict[int, _Item], rounds: int = 12) -> None:
    """Positions across the layers: each item moves towards the mean of its neighbours, then
    the layer is pushed apart to keep its order and the gaps."""

    def gap(a: _Item, b: _Item) -> float:
        space = NODE_GAP_PT if a.key >= 0 and b.key >= 0 else NODE_GAP_PT / 2
        return (a.across + b.across) / 2 + space

    for row in rows:  # start: stacked, centred on 0
        v = 0.0
        for i, key in enumerate(row):
            if i:
                v += gap(items[row[i - 1]], items[key])
            items[key].v = v
        for key in row:
            items[key].v -= v / 2
    for r in range(rounds):
        sequence = rows if r % 2 == 0 else rows[::-1]
        for row in sequence:
            wanted = []
            for key in row:
                near = [items[n].v for n in items[key].neighbours]
                wanted.append(sum(near) / len(near) if near else items[key].v)
            placed = list(wanted)
            for i in range(1, len(row)):  # push down to keep the order and the gaps
                placed[i] = max(placed[i], placed[i - 1] + gap(items[row[i - 1]], items[row[i]]))
            shift = (sum(wanted) - sum(placed)) / len(row)
            for key, v in zip(row, placed, strict=True):
                items[key].v = v + shift


# -- the picture ---------------------------------------------------------------------------


class GraphDrawing:
    """A drawn graph: its :class:`Graph`, its :class:`Layout` and the picture.

    A notebook shows it as a PNG at :data:`DPI`; :meth:`smallest_text_px` and
    :meth:`Layout.edges_through_boxes` say whether it can be read at display size.
    """

    def __init__(self, graph: Graph, layout: Layout, title: str | None = None) -> None:
        self.graph = graph
        self.layout = layout
        self.title = title

    def __repr__(self) -> str:
        return (
            f"GraphDrawing({len(self.graph.nodes)} nodes, {len(self.graph.edges)} edges, "
            f"{self.layout.direction}, {self.pixel_size()[0]}×{self.pixel_size()[1]} px)"
        )

    def pixel_size(self, dpi: int = DPI) -> tuple[int, int]:
        """Width and height of the PNG."""
        return round(self.layout.width / 72 * dpi), round(self.layout.height / 72 * dpi)

    def display_scale(self, display_width: float = DISPLAY_WIDTH_PX, dpi: int = DPI) -> float:
        """How much the page shrinks the PNG: 1 when it fits ``display_width`` pixels."""
        return min(1.0, display_width / self.pixel_size(dpi)[0])

    def smallest_text_px(self, display_width: float = DISPLAY_WIDTH_PX, dpi: int = DPI) -> float:
        """The height of the smallest text in pixels, as the page shows it."""
        scale = self.display_scale(display_width, dpi)
        return min(self.layout.font_sizes) / 72 * dpi * scale

    def figure(self) -> Figure:
        """The picture as a matplotlib Figure (not registered with pyplot)."""
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

        lay = self.layout
        figure = Figure(figsize=(lay.width / 72, lay.height / 72), dpi=DPI)
        ax = figure.add_axes((0.0, 0.0, 1.0, 1.0))
        ax.set_xlim(0, lay.width)
        ax.set_ylim(0, lay.height)
        ax.axis("off")
        for edge in lay.edges:
            xs, ys = zip(*edge.points, strict=True)
            ax.plot(xs[:-1] + (xs[-1],), ys, color="#4b5563", linewidth=0.9, zorder=1)
            ax.add_patch(
                FancyArrowPatch(
                    edge.points[-2],
                    edge.points[-1],
                    arrowstyle="-|>",
                    mutation_scale=8,
                    color="#4b5563",
                    linewidth=0.9,
                    shrinkA=0,
                    shrinkB=0,
                    zorder=1,
                )
            )
            if edge.count > 1:
                (x0, y0), (x1, y1) = edge.points[-2], edge.points[-1]
                ax.text(
                    (x0 + x1) / 2,
                    (y0 + y1) / 2 + 1,
                    f"×{edge.count}",
                    fontsize=FONT_PT,
                    ha="center",
                    va="bottom",
                    color="#4b5563",
                )
        for box in lay.boxes.values():
            fill, stroke = COLOURS[box.kind]
            left, bottom, _, _ = box.bounds
            ax.add_patch(
                FancyBboxPatch(
                    (left, bottom),
                    box.width,
                    box.height,
                    boxstyle="round,pad=0,rounding_size=3",
                    facecolor=fill,
                    edgecolor=stroke,
                    linewidth=2.0 if box.emphasis else 0.8,
                    zorder=2,
                )
            )
            top = box.y + box.height / 2 - BOX_PAD_PT
            for i, line in enumerate(box.lines):
                ax.text(
                    box.x,
                    top - (i + 0.5) * LINE_PT + 1,
                    line,
                    fontsize=FONT_PT,
                    fontweight="bold" if i == 0 else "normal",
                    ha="center",
                    va="center",
                    zorder=3,
                )
        for x, y, kind in lay.legend:
            fill, stroke = COLOURS[kind]
            ax.add_patch(
                Rectangle(
                    (x, y - FONT_PT * 0.1),
                    FONT_PT * 1.1,
                    FONT_PT * 0.9,
                    facecolor=fill,
                    edgecolor=stroke,
                    linewidth=0.8,
                )
            )
        for x, y, text, size in lay.texts:
            is_title = size == TITLE_PT and text == self.title
            ax.text(
                x,
                y,
                text,
                fontsize=size,
                ha="center" if is_title else "left",
                va="center",
                fontweight="bold" if is_title else "normal",
            )
        return figure

    @cached_property
    def png(self) -> bytes:
        """The PNG a notebook shows."""
        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="png", dpi=DPI)
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png


def draw(
    tensor: Tensor | Graph,
    names: Mapping[Tensor, str] | None = None,
    scalar_constants: bool = False,
    title: str | None = None,
    direction: Direction | Literal["auto"] = "auto",
) -> GraphDrawing:
    """Draw the graph behind ``tensor``: boxes with values and gradients, fan-out nodes in orange
    with ``Σ fan-out ×k``, routing nodes in green, the root with a thick border.

    ``direction``: ``"LR"`` (inputs on the left), ``"TB"`` (inputs on top) or ``"auto"``: left
    to right when that fits the page (:data:`DISPLAY_WIDTH_PX`), else whichever direction
    shrinks the text least. Scalar constants (the ``2`` of ``x * 2``) are left out unless
    ``scalar_constants``.
    """
    graph = _graph(tensor, names, scalar_constants)
    if direction != "auto":
        return GraphDrawing(graph, layout(graph, direction, title), title)
    drawings = [GraphDrawing(graph, layout(graph, d, title), title) for d in ("LR", "TB")]
    fitting = [d for d in drawings if d.display_scale() == 1.0]
    if fitting:
        return fitting[0]
    return max(drawings, key=lambda d: d.display_scale())


# -- DOT -------------------------------------------------------------------------------------


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(
    tensor: Tensor | Graph,
    names: Mapping[Tensor, str] | None = None,
    scalar_constants: bool = True,
) -> str:
    """Graphviz DOT text of the graph behind ``tensor`` (inputs on the left, the root right)."""
    graph = _graph(tensor, names, scalar_constants)
    lines = [
        "digraph chainrule {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
    ]
    for node in graph.nodes:
        fill, edge = COLOURS[node.kind]
        attrs = [f"label={_dot_string(node.label)}", f'fillcolor="{fill}"', f'color="{edge}"']
        if node.sums_gradients:
            attrs.append("penwidth=2.5")
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
